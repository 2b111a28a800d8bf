"""What a ``%%train`` / ``%%sweep`` output keeps once its widget is gone (issue 34): beside the widget every display
holds a static form, ``text/plain`` and ``text/html`` (state, reason, metrics summary, last log lines, links) and the
JSON the JupyterLab panel extension renders live, re-published in place when the job ends.

- the static form's pure functions, fed canned API answers;
- a notebook executed headless by nbclient in a real kernel against the jobs-API stand-in
  (tests/jobs_contract_server.py: jobs run as real subprocesses): the saved output reads as the job's final state
  and last lines, never ``VBox(children=...``; the same for a job awaited in a later cell.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest

pytest.importorskip("ipywidgets")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from trainhub.kernels.sweep import SWEEP_MIME, sweep_static_bundle  # noqa: E402
from trainhub.kernels.widget import JOB_MIME, job_links, metrics_summary, static_bundle  # noqa: E402

NOW = datetime(2026, 11, 21, 20, 10, 5, tzinfo=timezone.utc)
DONE = {"id": "j-000042", "name": "resnet", "user": "alice", "state": "succeeded", "reason": "the worker exited with code 0",
        "gpus": 1, "workers": 1, "devices": [[0]], "profile": "gpu-1", "created": "2026-11-21T20:08:00Z",
        "started": "2026-11-21T20:09:00Z", "finished": "2026-11-21T20:09:30Z", "attempt": 1,
        "outputs_url": "file:///storage/users/alice/jobs/j-000042", "script": "print('x')", "env": {"SECRET": "s"}}
METRICS = {"metrics": [{"time": "t", "step": s, "worker": 0, "values": {"loss": 1 / (s + 1), "acc": s / 10}} for s in range(5)]}
LOGS = "".join(f"2026-11-21T20:09:{i:02d}.123Z [0] epoch {i} <ok>\n" for i in range(30))


def test_the_static_form_reads_as_the_job():
    bundle = static_bundle(DONE, LOGS, METRICS, job_links(DONE, "/user/alice/"), now=NOW)
    text, page, data = bundle["text/plain"], bundle["text/html"], bundle[JOB_MIME]
    assert text.splitlines()[0] == "j-000042 resnet: succeeded (the worker exited with code 0)"
    assert "elapsed 00:30 · 1 GPU x 1 worker (devices 0) · profile gpu-1" in text
    assert "metrics: loss 0.2 (step 4), acc 0.4 (step 4)" in text
    assert "    20:09:29 [0] epoch 29 <ok>" in text and "epoch 19 " not in text  # the last 10 lines
    assert "jobs table: /user/alice/lab?trainhub-job=j-000042" in text
    assert "TensorBoard: /user/alice/trainhub/tensorboard/open?jobs=j-000042" in text
    assert ">succeeded<" in page and "epoch 29 &lt;ok&gt;" in page and "href='/user/alice/lab?trainhub-job=j-000042'" in page
    assert data["id"] == "j-000042" and data["kind"] == "job" and data["job"]["state"] == "succeeded"
    assert data["logs"][-1] == "20:09:29 [0] epoch 29 <ok>" and len(data["logs"]) == 10
    assert data["metrics"] == {"loss": [4.0, 0.2], "acc": [4.0, 0.4]}
    assert "script" not in data["job"] and "env" not in data["job"]  # what the header shows, nothing more


def test_a_queued_job_outside_a_server_has_no_links_and_says_so():
    queued = dict(DONE, state="queued", reason="waiting for 1 GPU: 0 of 4 free", started=None, finished=None)
    bundle = static_bundle(queued, "", None, job_links(queued, ""), now=NOW)
    assert bundle["text/plain"].splitlines()[:3] == [
        "j-000042 resnet: queued (waiting for 1 GPU: 0 of 4 free)",
        "  waiting 02:05 · 1 GPU x 1 worker (devices 0) · profile gpu-1",
        "  (no log output yet)"]
    assert bundle[JOB_MIME]["links"] == {} and "jobs table" not in bundle["text/plain"]
    assert metrics_summary({"metrics": []}) == ""


def test_the_sweep_static_form():
    sweep = {"id": "s-000003", "name": "lr", "state": "completed", "trials": 3, "parallel": 2, "metric": "loss",
             "mode": "min", "sampler": "tpe", "pruner": "median", "progress": {"done": 3, "complete": 3},
             "best": {"number": 1, "value": 0.25, "params": {"lr": 0.01}, "job_id": "j-000011"}}
    trials = [{"number": i, "state": "complete", "value": 0.5 / (i + 1), "params": {"lr": 10.0 ** -i}, "job_id": f"j-00001{i}"}
              for i in range(3)]
    bundle = sweep_static_bundle(sweep, trials, {"jobs_table": "/user/alice/lab?trainhub-sweep=s-000003"})
    text = bundle["text/plain"]
    assert text.startswith("sweep s-000003 completed: 3/3 trials done, 3 complete, 0 running; best loss = 0.25")
    assert "j-000012" in text and "trials in the jobs table: /user/alice/lab?trainhub-sweep=s-000003" in text
    assert ">completed<" in bundle["text/html"] and "j-000012" in bundle["text/html"]
    assert bundle[SWEEP_MIME]["sweep"]["best"]["value"] == 0.25 and len(bundle[SWEEP_MIME]["trials"]) == 3


# -- headless: nbclient in a real kernel ---------------------------------------------------------------
def _run(cells: list[str], jobs_api, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    env = dict(os.environ, TRAINHUB_API_URL=jobs_api.url, JUPYTERHUB_API_TOKEN=jobs_api.token, JUPYTERHUB_USER="alice",
               JUPYTERHUB_SERVICE_PREFIX="/user/alice/")
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)
    path = tmp_path / "ran.ipynb"
    nbformat.write(nb, path)
    return nbformat.read(path, as_version=4)  # as saved


def _displays(cell) -> list[dict]:
    return [o["data"] for o in cell.outputs if o.output_type in ("display_data", "execute_result")]


def _job_display(cell) -> dict:
    (data,) = [d for d in _displays(cell) if JOB_MIME in d]
    return data


@pytest.mark.parametrize("where", ["--wait", "a later cell waits"])
def test_a_headless_run_saves_the_final_state_and_last_lines(jobs_api, tmp_path, where):
    body = ("import trainhub\n"
            "for step in range(3):\n"
            "    trainhub.log_metrics(step=step, loss=1.0 / (step + 1))\n"
            "    print('training step', step, flush=True)\n"
            "print('the last line of the job', flush=True)\n")
    if where == "--wait":
        cells = ["%load_ext trainhub.kernels", "%%train --wait --as job --name headless\n" + body]
    else:
        cells = ["%load_ext trainhub.kernels", "%%train --as job --name headless\n" + body, "job.wait(); print('awaited')"]
    nb = _run(cells, jobs_api, tmp_path)
    cell = nb.cells[1]
    data = _job_display(cell)
    text, page = data["text/plain"], data["text/html"]
    assert "VBox(" not in text and not any("VBox(" in d.get("text/plain", "") for d in _displays(cell)), cell.outputs
    assert ": succeeded" in text.splitlines()[0] and "headless" in text.splitlines()[0], text
    assert "the last line of the job" in text and "training step 2" in text, text
    assert "metrics: loss 0.3333 (step 2)" in text, text
    assert "jobs table: /user/alice/lab?trainhub-job=" in text
    assert ">succeeded<" in page and "the last line of the job" in page, page
    assert data[JOB_MIME]["job"]["state"] == "succeeded" and data[JOB_MIME]["logs"][-1].endswith("the last line of the job")
    # the live widget is in the same output, for a frontend with its kernel
    assert "application/vnd.jupyter.widget-view+json" in data
