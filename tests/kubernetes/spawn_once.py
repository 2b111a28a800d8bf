"""Spawn and stop one notebook with GPUKubeSpawner in a process of its own, as whatever identity
``$KUBECONFIG`` holds (the tests run it as the chart's hub ServiceAccount). Prints a JSON line:
``{"url": ..., "pod": ..., "error": ...}``. Usage: ``python spawn_once.py USER PROFILE CONFIG_JSON``
where CONFIG_JSON is ``{"Section__name": value}`` overrides for ``k8s_test_config.spawner_config``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))

from k8s_test_config import spawner_config  # noqa: E402


async def main(user: str, profile: str, overrides: dict) -> dict:
    from kubespawner import KubeSpawner

    from trainhub.spawner.kubernetes import GPUKubeSpawner

    spawner = GPUKubeSpawner(_mock=True, config=spawner_config(**overrides),
                             user=SimpleNamespace(name=user, id=1, url=f"/user/{user}/", admin=False, groups=[]))
    spawner.user_options = {"profile": profile}
    out = {"pod": spawner.pod_name, "namespace": spawner.namespace}
    try:
        out["url"] = await spawner.start()
        await spawner.stop(now=True)
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        await KubeSpawner._stop_all_reflectors()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
