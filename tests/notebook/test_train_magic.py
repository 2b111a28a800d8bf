"""End to end: %%train from a notebook executed by nbclient in a real kernel, against the real
jobs service behind a real `trainhub up`.

Needs the ``platform`` fixture (tests/conftest.py): ``.url`` (public base URL, e.g.
``http://127.0.0.1:8000``), ``.token(user) -> str`` (a JupyterHub API token for ``user``) and
``.data_dir``.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
import requests

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.e2e

CELL_TIMEOUT = 300  # seconds; the job cell waits for a real job


def _notebook(cells: list[tuple[str, list[str]]]):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src, metadata={"tags": tags}) for src, tags in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _execute(nb, env: dict, cwd: Path):
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute(env=env)
    return nb


def _text(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o["text"])
        elif o.get("output_type") == "error":
            out.append(f"{o['ename']}: {o['evalue']}")
        elif "data" in o and "text/plain" in o["data"]:
            out.append(o["data"]["text/plain"])
    return "".join(out)


@pytest.fixture
def user_api(platform):
    user = f"e2e-train-{uuid.uuid4().hex[:6]}"
    token = platform.token(user)
    api = platform.url.rstrip("/") + "/services/trainhub/api"
    session = requests.Session()
    session.headers["Authorization"] = f"token {token}"

    def get(path, **params):
        r = session.get(api + path, params=params, timeout=30)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r

    env = dict(os.environ, TRAINHUB_API_URL=api, JUPYTERHUB_API_TOKEN=token, JUPYTERHUB_USER=user)
    return user, env, get


def test_train_magic_runs_notebook_context_as_a_job(user_api, tmp_path):
    user, env, get = user_api
    marker = uuid.uuid4().hex[:8]
    nb = _notebook([
        ("def helper(n):\n"
         f"    print('helper-{marker} got', n, flush=True)\n"
         "    return n * 2\n", []),
        ("%load_ext trainhub.kernels", []),
        ("%%train --wait --as job --name e2e-train\n"
         "import trainhub\n"
         "value = helper(21)\n"
         "trainhub.log_metrics(step=1, loss=0.5)\n"
         "(trainhub.outputs_dir() / 'result.json').write_text(str(value))\n", []),
        ("print('JOB_ID=' + job.id, job.status)", []),
    ])
    _execute(nb, env, tmp_path)
    out = _text(nb.cells[3])
    assert "JOB_ID=" in out and "succeeded" in out, [_text(c) for c in nb.cells]
    job_id = out.split("JOB_ID=", 1)[1].split()[0]

    job = get(f"/jobs/{job_id}").json()
    assert job["state"] == "succeeded" and job["user"] == user and job["name"] == "e2e-train"
    assert "def helper" in (job.get("script") or "")
    logs = get(f"/jobs/{job_id}/logs").text
    assert f"helper-{marker} got 21" in logs
    metrics = get(f"/jobs/{job_id}/metrics").json()
    assert any(r["values"].get("loss") == 0.5 and r["step"] == 1 for r in metrics["metrics"]), metrics
    outputs = Path(job["outputs_path"]) if job.get("outputs_path") else None
    if outputs is not None and outputs.exists():  # single-machine platform: the dir is local
        assert (outputs / "result.json").read_text() == "42"


def test_unknown_flag_errors_with_usage_and_submits_nothing(user_api, tmp_path):
    user, env, get = user_api
    before = get("/jobs", limit=1).json()["total"]
    nb = _notebook([
        ("%load_ext trainhub.kernels", []),
        ("%%train --gpu 1 --bogus\nprint('must not run')\n", ["raises-exception"]),
        ("print('after')", []),
    ])
    _execute(nb, env, tmp_path)
    text = _text(nb.cells[1])
    assert "unrecognized arguments: --gpu 1 --bogus" in text and "usage: %%train" in text and "--gpus N" in text
    assert "after" in _text(nb.cells[2])
    assert get("/jobs", limit=1).json()["total"] == before
    assert json.dumps(get("/jobs", limit=50).json()).count("must not run") == 0
