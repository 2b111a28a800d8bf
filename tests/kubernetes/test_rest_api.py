"""user_options through the JupyterHub REST API: an in-process hub (JupyterHub's MockHub, a real
configurable-http-proxy) spawning with GPUKubeSpawner against the API stand-in."""

from __future__ import annotations

import shutil

import pytest
from waiting import await_for
import pytest_asyncio
from k8s_test_config import NAMESPACE, REAL_KUBECONFIG, spawner_config

pytestmark = [
    pytest.mark.skipif(not shutil.which("configurable-http-proxy"), reason="configurable-http-proxy is not installed"),
    pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="the hub's pod IPs are not reachable from the test runner"),
]


@pytest_asyncio.fixture(scope="module")
async def hub(cluster):
    from jupyterhub.tests.mocking import MockHub

    from trainhub.spawner.kubernetes import GPUKubeSpawner

    config = spawner_config()
    config.JupyterHub.spawner_class = GPUKubeSpawner
    config.Spawner.http_timeout = 2   # pods on the stand-in never answer HTTP
    config.JupyterHub.tornado_settings = {"slow_spawn_timeout": 5}
    app = MockHub.instance(config=config)
    await app.initialize([])
    await app.start()
    try:
        yield app
    finally:
        # JupyterHub.stop() cancels every task of the loop (the stand-in's too): clean up by hand
        app.log.handlers = []
        MockHub.clear_instance()
        if app.http_server:
            app.http_server.stop()
        for callback in app._periodic_callbacks.values():
            callback.stop()
        await app.cleanup()


async def _post_server(hub, user, body):
    from jupyterhub.tests.utils import add_user, api_request

    add_user(hub.db, hub, name=user)
    return await api_request(hub, "users", user, "server", method="post", json=body, name=user)


@pytest.mark.parametrize("body,status,fragment", [
    ({"profile": "no-such"}, 400, "Unknown profile"),
    ({"profile": "gpu-8"}, 400, "no node can hold that"),
    ({"profile": "staff-gpu"}, 403, "limited to the groups staff"),
])
async def test_refusals_reach_the_api_caller(hub, cluster, body, status, fragment):
    before = set(await cluster.pods())
    resp = await _post_server(hub, "rest-refused", body)
    assert resp.status_code == status, resp.text
    assert fragment in resp.json()["message"]
    assert set(await cluster.pods()) == before


async def test_profile_from_rest_body_reaches_the_pod(hub, cluster):
    from jupyterhub.tests.utils import api_request

    # answer the POST at once (202) and let the spawn go on: what matters is the pod it creates
    hub.tornado_application.settings["slow_spawn_timeout"] = 0
    try:
        resp = await _post_server(hub, "rest-ok", {"profile": "mig-small"})
    finally:
        hub.tornado_application.settings["slow_spawn_timeout"] = 5
    assert resp.status_code in (201, 202), resp.text
    pods = await await_for(cluster.pods, lambda pods: "jupyter-rest-ok" in pods, what="the pod jupyter-rest-ok",
                           timeout=20, describe=lambda pods: f"pods: {sorted(pods)}")
    pod = pods["jupyter-rest-ok"]
    assert pod["metadata"]["namespace"] == NAMESPACE
    assert pod["metadata"]["annotations"]["trainhub.io/profile"] == "mig-small"
    limits = next(c for c in pod["spec"]["containers"] if c["name"] == "notebook")["resources"]["limits"]
    assert limits["nvidia.com/mig-1g.10gb"] == "1"
    user = hub.users["rest-ok"]
    assert user.spawner.user_options == {"profile": "mig-small"}

    # stop it through the API; the pod goes away
    await await_for(lambda: user.spawner.pending, lambda pending: pending != "spawn", what="the spawn to settle",
                    timeout=60)
    resp = await api_request(hub, "users", "rest-ok", "server", method="delete", name="rest-ok")
    assert resp.status_code in (202, 204), resp.text
    await await_for(cluster.pods, lambda pods: "jupyter-rest-ok" not in pods, what="the pod jupyter-rest-ok gone",
                    timeout=20, describe=lambda pods: f"pods: {sorted(pods)}")
    assert "jupyter-rest-ok" not in await cluster.pods()
