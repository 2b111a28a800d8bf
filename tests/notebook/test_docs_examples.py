"""Every ``python`` block of docs/notebooks.md runs as it is, in order, in one kernel of a user's server on a real
`trainhub up` (issue 34: its storage examples used pandas, which the platform does not have and a user cannot
install). The blocks' jobs are then checked through the jobs API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parents[2] / "docs" / "notebooks.md"
USER = "docs-dora"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)


def test_the_page_has_its_examples():
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 5 and any(b.startswith("%%train") for b in blocks)
    assert not any("pandas" in b or "import torch" in b for b in blocks), "examples use only what the platform installs"


def test_every_python_example_runs_in_a_platform_kernel(platform):
    platform.spawn(USER, "cpu", timeout=180)
    token = platform.token(USER)
    headers = {"Authorization": f"token {token}"}
    base = f"{platform.url}/user/{USER}/api/kernels"
    r = requests.post(base, headers=headers, json={"name": "python3"}, timeout=60)
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]
    outputs = []
    try:
        for n, block in enumerate(python_blocks(DOC.read_text()), 1):
            try:
                out = platform.kernel_exec(USER, block, token=token, kernel_id=kernel, timeout=300, store_history=True)
                assert "Error" not in out, out  # a magic's refusal (UsageError) is printed, not raised
                outputs.append(out)
            except AssertionError as e:
                raise AssertionError(f"block {n} of docs/notebooks.md failed:\n{block}\n{e}") from None
    finally:
        requests.delete(f"{base}/{kernel}", headers=headers, timeout=30)
        platform.stop_server(USER)
    api = platform.url + "/services/trainhub/api"
    jobs = requests.get(f"{api}/jobs", headers=headers, params={"limit": 10}, timeout=30).json()["items"]
    assert [j["state"] for j in jobs] == ["succeeded"] * 3, ([(j["id"], j["name"], j["state"], j["reason"]) for j in jobs], outputs)
    linear = next(j for j in jobs if j["name"] == "linear")
    losses = [m["values"]["loss"] for m in requests.get(f"{api}/jobs/{linear['id']}/metrics", headers=headers,
                                                        timeout=30).json()["metrics"]]
    assert len(losses) == 100 and losses[-1] < losses[0] / 10, losses[::20]
    loaded = next(j for j in jobs if j["name"] != "linear" and j["script"] and "np.load" in j["script"])
    assert "loaded (100000, 32)" in requests.get(f"{api}/jobs/{loaded['id']}/logs", headers=headers, timeout=30).text
    assert outputs[-1].splitlines()[-1].startswith("succeeded {"), outputs[-1]
