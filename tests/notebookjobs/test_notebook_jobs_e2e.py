"""Whole notebooks as jobs through JupyterLab's own jupyter-scheduler REST API on a user's real server
(docs/notebook-jobs.md): ``POST <server>/scheduler/jobs`` with a parameter runs the notebook as a trainhub job
(papermill inside the job, as the user); bad inputs are refused with what to change and leave nothing behind; a
job definition's schedule fires, as its owner, while the owner's server is stopped, when the schedule clock passes
its time; a run missed meanwhile is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import nbformat
import pytest
import requests

from waiting import wait_for

USER = "nbjobs-ann"
API = "/services/trainhub/api"


def notebook(params: str = "lr = 0.1\ntag = 'base'") -> str:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# train"), cell,
                nbformat.v4.new_code_cell("with open(f'side-{tag}.txt', 'w') as f:\n    f.write(str(lr * 2))\nprint('LR IS', lr)")]
    return nbformat.writes(nb)


class Server:
    def __init__(self, platform, user):
        self.p, self.user = platform, user
        self.headers = {"Authorization": f"token {platform.token(user)}"}
        self.base = f"{platform.url}/user/{user}"

    def put(self, path, text):
        r = requests.put(f"{self.base}/api/contents/{path}", headers=self.headers, timeout=60,
                         json={"type": "file", "format": "text", "content": text})
        assert r.status_code in (200, 201), r.text

    def mkdir(self, path):
        r = requests.put(f"{self.base}/api/contents/{path}", headers=self.headers, json={"type": "directory"}, timeout=60)
        assert r.status_code in (200, 201), r.text

    def read(self, path):
        r = requests.get(f"{self.base}/api/contents/{path}", headers=self.headers, params={"content": "1"}, timeout=60)
        return r

    def scheduler(self, method, path, **kw):
        return requests.request(method, f"{self.base}/scheduler/{path}", headers=self.headers, timeout=120, **kw)

    def jobs_api(self, method, path, token=None, **kw):
        headers = {"Authorization": f"token {token}"} if token else self.headers
        return requests.request(method, f"{self.p.url}{API}{path}", headers=headers, timeout=60, **kw)


def outputs_text(nb_json: dict) -> str:
    out = []
    for cell in nb_json["cells"]:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") if isinstance(o.get("text"), str) else "".join(o.get("text", [])))
    return "".join(out)


@pytest.fixture
def server(platform):
    platform.spawn(USER, "cpu")
    s = Server(platform, USER)
    s.mkdir("proj")
    s.put("proj/train.ipynb", notebook())
    yield s
    for d in (s.jobs_api("GET", "/notebook-schedules").json() or {}).get("items", []):
        s.jobs_api("DELETE", f"/notebook-schedules/{d['id']}")
    platform.stop_server(USER)


def test_create_notebook_job_runs_through_trainhub_with_its_parameter(platform, server):
    envs = server.scheduler("GET", "runtime_environments")
    assert envs.status_code == 200, envs.text
    assert "cpu" in [e["name"] for e in envs.json()], envs.text
    r = server.scheduler("POST", "jobs", json={
        "input_uri": "proj/train.ipynb", "runtime_environment_name": "cpu", "name": "nb-param",
        "parameters": {"lr": "0.5", "tag": "run1"}, "output_formats": ["ipynb", "html"], "compute_type": "cpu"})
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    # the same job in trainhub's API and CLI
    job = server.jobs_api("GET", f"/jobs/{job_id}").json()
    assert job["user"] == USER and job["profile"] == "cpu", job
    done = wait_for(lambda: server.scheduler("GET", f"jobs/{job_id}").json(),
                    lambda j: j["status"] in ("COMPLETED", "FAILED", "STOPPED"), what=f"notebook job {job_id} ending",
                    timeout=300, interval=1)
    logs = server.jobs_api("GET", f"/jobs/{job_id}/logs").text
    assert done["status"] == "COMPLETED", (done, logs[-3000:])
    assert server.jobs_api("GET", f"/jobs/{job_id}").json()["state"] == "succeeded"
    # the executed notebook and the side file, next to the input, written by the job as the user
    files = {f["file_format"]: f["file_path"] for f in done["job_files"]}
    assert files["ipynb"] == f"proj/train-{job_id}.ipynb" and files["html"] == f"proj/train-{job_id}.html", done
    executed = server.read(f"proj/train-{job_id}.ipynb")
    assert executed.status_code == 200, executed.text
    assert "LR IS 0.5" in outputs_text(executed.json()["content"]), executed.json()["content"]
    assert server.read("proj/side-run1.txt").json()["content"] == "1.0"
    assert server.read(f"proj/train-{job_id}.html").status_code == 200
    # the Notebook Jobs list shows it; `trainhub jobs list` too
    listing = server.scheduler("GET", "jobs").json()
    assert job_id in [j["job_id"] for j in listing["jobs"]], listing
    listed = subprocess.run([sys.executable, "-m", "trainhub.cli", "jobs", "list", "--json", "--url", platform.url + API,
                             "--token", platform.token(USER)], capture_output=True, text=True, timeout=60, check=True)
    assert job_id in [j["id"] for j in json.loads(listed.stdout)["items"]], listed.stdout[-2000:]
    # delete: off the Notebook Jobs list, the trainhub record stays
    assert server.scheduler("DELETE", f"jobs/{job_id}").status_code == 204
    assert job_id not in [j["job_id"] for j in server.scheduler("GET", "jobs").json()["jobs"]]


def test_cancel_a_running_notebook_job(platform, server):
    server.put("proj/slow.ipynb", notebook("lr = 0.1\ntag = 'slow'\nimport time\ntime.sleep(600)"))
    r = server.scheduler("POST", "jobs", json={"input_uri": "proj/slow.ipynb", "runtime_environment_name": "cpu",
                                               "name": "slow"})
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    wait_for(lambda: server.jobs_api("GET", f"/jobs/{job_id}").json()["state"], lambda s: s == "running",
             what="the slow notebook job running", timeout=120, interval=0.5)
    assert server.scheduler("PATCH", f"jobs/{job_id}", json={"status": "STOPPED"}).status_code == 204
    end = wait_for(lambda: server.scheduler("GET", f"jobs/{job_id}").json(), lambda j: j["status"] == "STOPPED",
                   what="the slow notebook job stopped", timeout=120, interval=0.5)
    assert server.jobs_api("GET", f"/jobs/{job_id}").json()["state"] == "cancelled", end


@pytest.mark.parametrize("body, status, says", [
    ({"input_uri": "proj/broken.ipynb"}, 400, "is not a notebook Jupyter can read"),
    ({"compute_type": "gpu-99"}, 400, "unknown profile 'gpu-99'"),
    ({"parameters": {"epochs": "3"}}, 400, "does not declare the parameter(s) epochs"),
    ({"parameters": {"lr": "fast"}}, 400, "parameter lr must be a float"),
    ({"runtime_environment_parameters": {"workers": "two"}}, 400, "workers must be a whole number"),
    ({"input_uri": "proj/missing.ipynb"}, 404, "does not exist"),
    ({"input_uri": "../../../etc/x.ipynb"}, 403, "is outside your home folder"),
    # refusals of the jobs API come through with its status and words: the pool (409), the GPU quota (403)
    ({"compute_type": "gpu-1", "runtime_environment_parameters": {"gpus": 9}}, 409, "the pool has only 4"),
    ({"compute_type": "gpu-1", "runtime_environment_parameters": {"gpus": 2, "workers": 2}}, 403, "GPU quota exceeded"),
    ({"parameters": "lr=0.5"}, 400, "value is not a valid dict"),  # a body jupyter-scheduler's own model refuses
])
def test_bad_input_is_refused_with_its_status_and_what_to_change_and_nothing_is_made(platform, server, body, status, says):
    server.put("proj/broken.ipynb", "{this is not json")
    before = server.jobs_api("GET", "/jobs").json()["total"]
    r = server.scheduler("POST", "jobs", json={"input_uri": "proj/train.ipynb", "runtime_environment_name": "cpu",
                                               "name": "bad", **body})
    # jupyter-scheduler's own REST API, through trainhub's handlers: the refusal's status, the back end's message
    assert r.status_code == status and says in r.json()["message"], (r.status_code, r.text)
    assert server.jobs_api("GET", "/jobs").json()["total"] == before


@pytest.mark.parametrize("body, says", [
    ({"schedule": "61 * * * *"}, "is not a cron expression"),
    ({"schedule": "0 3 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
    ({"schedule": "0 3 * * *", "parameters": {"epochs": "3"}}, "does not declare the parameter(s) epochs"),
])
def test_a_bad_definition_is_refused_with_400_and_none_is_made(platform, server, body, says):
    r = server.scheduler("POST", "job_definitions", json={
        "input_uri": "proj/train.ipynb", "runtime_environment_name": "cpu", "name": "bad-def", **body})
    assert r.status_code == 400 and says in r.json()["message"], (r.status_code, r.text)
    assert server.jobs_api("GET", "/notebook-schedules").json()["total"] == 0
    assert server.scheduler("GET", "job_definitions").json()["total_count"] == 0


def test_another_users_job_or_definition_is_not_found(platform, server):
    other = platform.token("nbjobs-bob")
    job = server.jobs_api("POST", "/jobs", token=other, json={"command": "true", "name": "bobs"})
    assert job.status_code == 201, job.text
    for path in (f"jobs/{job.json()['id']}", "job_definitions/ns-999999", "jobs/j-999999"):
        r = server.scheduler("GET", path)
        assert r.status_code == 404 and r.json()["message"], (path, r.status_code, r.text)
    r = server.scheduler("DELETE", f"jobs/{job.json()['id']}")
    assert r.status_code == 404, r.text
    assert server.jobs_api("GET", f"/jobs/{job.json()['id']}", token=other).json()["state"] != "cancelled"


def test_a_schedule_fires_as_its_owner_while_the_server_is_stopped(platform, server):
    year = datetime.now(timezone.utc).year + 1
    r = server.scheduler("POST", "job_definitions", json={
        "input_uri": "proj/train.ipynb", "runtime_environment_name": "cpu", "name": "yearly", "schedule": "0 0 1 1 *",
        "timezone": "UTC", "parameters": {"lr": "4", "tag": "sched"}})
    assert r.status_code == 200, r.text
    def_id = r.json()["job_definition_id"]
    d = server.scheduler("GET", f"job_definitions/{def_id}").json()
    assert d["schedule"] == "0 0 1 1 *" and d["active"] and d["parameters"] == {"lr": "4.0", "tag": "sched"}, d  # as it will run: the declared default is a float
    platform.stop_server(USER)

    admin = platform.token(platform.admin_user, admin=True)
    # the clock stops short of the due time: nothing fires
    r = server.jobs_api("POST", "/schedule-clock", token=admin, json={"now": f"{year - 1}-12-31T23:59:00Z"})
    assert r.status_code == 200 and not [f for f in r.json()["fired"] if f["schedule"] == def_id], r.text
    # ... and passes it: one run, as the owner, with the server stopped
    r = server.jobs_api("POST", "/schedule-clock", token=admin, json={"now": f"{year}-01-01T00:00:30Z"})
    assert r.status_code == 200, r.text
    fired = [f for f in r.json()["fired"] if f["schedule"] == def_id]
    assert len(fired) == 1 and fired[0]["missed"] == [] and fired[0].get("job"), r.json()
    job_id = fired[0]["job"]
    job = wait_for(lambda: server.jobs_api("GET", f"/jobs/{job_id}", token=admin).json(),
                   lambda j: j["state"] in ("succeeded", "failed", "cancelled", "lost"), what=f"scheduled run {job_id}",
                   timeout=300, interval=1)
    logs = server.jobs_api("GET", f"/jobs/{job_id}/logs", token=admin).text
    assert job["state"] == "succeeded" and job["user"] == USER, (job, logs[-3000:])
    assert USER not in [u["name"] for u in platform.api("GET", "/users").json() if u.get("server")]

    # two due times passed at once (the service "was down"): the latest runs, the other is reported
    r = server.jobs_api("POST", "/schedule-clock", token=admin, json={"now": f"{year + 2}-01-01T00:00:30Z"})
    fired = [f for f in r.json()["fired"] if f["schedule"] == def_id]
    assert len(fired) == 1 and fired[0]["missed"] == [f"{year + 1}-01-01T00:00:00Z"], r.json()
    s = server.jobs_api("GET", f"/notebook-schedules/{def_id}").json()
    assert s["runs"] == 2 and s["missed"] == 1 and "missed 1 run(s)" in s["message"], s
    second = fired[0]["job"]
    wait_for(lambda: server.jobs_api("GET", f"/jobs/{second}", token=admin).json()["state"],
             lambda st: st in ("succeeded", "failed", "cancelled", "lost"), what=f"scheduled run {second}",
             timeout=300, interval=1)

    # the owner's server again: the executed notebook is next to the input, the runs in the Notebook Jobs list
    platform.spawn(USER, "cpu")
    executed = server.read(f"proj/train-{job_id}.ipynb")
    assert executed.status_code == 200 and "LR IS 4.0" in outputs_text(executed.json()["content"]), executed.text[:2000]
    assert server.read("proj/side-sched.txt").json()["content"] == "8.0"
    runs = server.scheduler("GET", "jobs", params={"job_definition_id": def_id}).json()["jobs"]
    assert {job_id, second} <= {j["job_id"] for j in runs}, runs
    # the list pages with jupyter-scheduler's max_items / next_token over the jobs API's notebook-job index: a plain
    # job of the user's, newer than both runs, is in neither page
    plain = server.jobs_api("POST", "/jobs", json={"command": "true", "name": "not-a-notebook"}).json()["id"]
    first = server.scheduler("GET", "jobs", params={"max_items": 1}).json()
    assert [j["job_id"] for j in first["jobs"]] == [second] and first["next_token"] == second, first
    page = server.scheduler("GET", "jobs", params={"max_items": 1, "next_token": first["next_token"]}).json()
    assert [j["job_id"] for j in page["jobs"]] == [job_id] and page["total_count"] == first["total_count"], page
    assert plain not in {j["job_id"] for j in first["jobs"] + page["jobs"]}
    # a run now, from the definition; then the definition goes
    r = server.scheduler("POST", f"job_definitions/{def_id}/jobs", json={})
    assert r.status_code == 200, r.text
    assert server.scheduler("DELETE", f"job_definitions/{def_id}").status_code == 204
    assert server.jobs_api("GET", f"/notebook-schedules/{def_id}").status_code == 404
