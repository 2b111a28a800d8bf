"""CONTRACT tests of TrainhubClient against docs/jobs-api.md's shapes.

The server is ``jobs_contract_server`` (in-process tornado stand-in, jobs run as local
subprocesses), not the real jobs service: end-to-end tests through `trainhub up` are in tests/jobs/test_jobs.py.
"""

from __future__ import annotations


import pytest

from trainhub.client import TrainhubAPIError, TrainhubClient, TrainhubConfigError


@pytest.fixture
def client(jobs_api):
    return TrainhubClient(jobs_api.url, jobs_api.token, retries=2, backoff=0.01)


SCRIPT = """\
import trainhub
print("hello from the job")
for step in range(3):
    trainhub.log_metrics(step=step, loss=1.0 / (step + 1))
(trainhub.outputs_dir() / "model.txt").write_text("weights")
"""


def test_submit_wait_logs_metrics(client, jobs_api):
    job = client.submit({"name": "t", "script": SCRIPT, "gpus": 1})
    assert job["id"].startswith("j-") and job["state"] in ("queued", "running")
    states = []
    final = client.wait(job["id"], poll=0.05, callback=lambda j: states.append(j["state"]), timeout=30)
    assert final["state"] == "succeeded", client.logs(job["id"])
    assert states[-1] == "succeeded"
    logs = client.logs(job["id"])
    assert "[0] hello from the job" in logs
    m = client.metrics(job["id"])
    assert [r["values"]["loss"] for r in m["metrics"]] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert [r["step"] for r in m["metrics"]] == [0, 1, 2]
    assert m["gpu"][0]["device"] == 0
    assert (jobs_api.service.root / job["id"] / "outputs" / "model.txt").read_text() == "weights"


def test_list_get_cancel(client):
    a = client.submit({"command": "sleep 30", "name": "sleeper"})
    b = client.submit({"command": "true"})
    client.wait(b["id"], poll=0.05, timeout=30)
    page = client.list()
    assert [j["id"] for j in page["items"]] == [b["id"], a["id"]]  # newest first
    assert page["total"] == 2 and page["limit"] == 50 and page["offset"] == 0
    assert [j["id"] for j in client.list(state="running")["items"]] == [a["id"]]
    assert [j["id"] for j in client.list(state=["running", "succeeded"], limit=1)["items"]] == [b["id"]]
    assert client.get(a["id"])["name"] == "sleeper"
    cancelled = client.cancel(a["id"])
    assert cancelled["state"] == "cancelled" and cancelled["reason"]


def test_wait_gives_up_after_its_timeout_naming_the_job(client):
    job = client.submit({"command": "sleep 30", "name": "sleeper"})
    seen = []
    with pytest.raises(TimeoutError, match=rf"waiting for job {job['id']} to end \(still (queued|running)\)") as e:
        client.wait(job["id"], poll=0.05, callback=seen.append, timeout=0.3)
    assert seen and e.value.last == seen[-1]  # the job as last seen
    assert client.cancel(job["id"])["state"] == "cancelled"


def test_logs_tail_and_follow(client):
    job = client.submit({"command": "for i in 1 2 3 4; do echo line$i; sleep 0.05; done"})
    lines = list(client.follow_logs(job["id"]))
    assert [ln.split("] ", 1)[1] for ln in lines] == ["line1", "line2", "line3", "line4"]
    assert client.logs(job["id"], tail=1).strip().endswith("line4")
    assert client.logs(job["id"], worker=0).count("\n") == 4


@pytest.mark.parametrize("spec, status, words", [
    ({"command": "true", "gpus": 3, "workers": 2}, 403, ["6 GPUs", "quota is 4"]),
    ({"command": "true", "gpus": 9}, 400, ["9 GPUs", "pool has 8"]),
    ({"command": "true", "profile": "huge"}, 400, ["profile", "huge"]),
    ({"command": "true", "script": "print(1)"}, 400, ["exactly one"]),
])
def test_errors_carry_the_server_message(client, jobs_api, spec, status, words):
    with pytest.raises(TrainhubAPIError) as e:
        client.submit(spec)
    assert e.value.status == status
    assert all(w in e.value.message for w in words), e.value.message
    assert jobs_api.service.posts == 1  # never submitted twice


def test_unknown_job_and_bad_token(client, jobs_api):
    with pytest.raises(TrainhubAPIError) as e:
        client.get("j-999999")
    assert e.value.status == 404 and "j-999999" in e.value.message
    bad = TrainhubClient(jobs_api.url, "nope", retries=0)
    with pytest.raises(TrainhubAPIError) as e:
        bad.list()
    assert e.value.status == 403


def test_gets_are_retried_on_503_posts_are_not(client, jobs_api):
    jobs_api.service.fail_gets = 2
    assert client.list()["total"] == 0  # third try answers
    jobs_api.service.fail_gets = 5
    with pytest.raises(TrainhubAPIError) as e:
        client.list()
    assert e.value.status == 503 and "jobs service" in e.value.message and "not answering" in e.value.message
    jobs_api.service.fail_posts = 1
    with pytest.raises(TrainhubAPIError) as e:
        client.submit({"command": "true"})
    assert e.value.status == 503 and jobs_api.service.posts == 1 and not jobs_api.service.jobs


def test_connection_refused_is_retried_then_reported():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = TrainhubClient(f"http://127.0.0.1:{port}/api", "t", retries=2, backoff=0.01)
    attempts, send = [], c.session.request
    c.session.request = lambda method, url, **kw: attempts.append((method, url)) or send(method, url, **kw)
    with pytest.raises(TrainhubAPIError) as e:
        c.submit({"command": "true"})  # nothing reached a server: safe to retry even a POST
    assert e.value.status == 0 and "cannot reach the trainhub API" in str(e.value)
    # retried `retries` times, then reported: no endless retrying
    assert attempts == [("POST", f"http://127.0.0.1:{port}/api/jobs")] * 3


def test_missing_configuration_says_what_to_do(monkeypatch):
    monkeypatch.delenv("TRAINHUB_API_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    with pytest.raises(TrainhubConfigError, match=r"not in a trainhub notebook/terminal: pass --url/--token or set "
                                                 r"\$TRAINHUB_API_URL and \$JUPYTERHUB_API_TOKEN"):
        TrainhubClient()
    monkeypatch.setenv("TRAINHUB_API_URL", "http://x/api")
    with pytest.raises(TrainhubConfigError, match=r"set \$JUPYTERHUB_API_TOKEN"):
        TrainhubClient()


def test_env_defaults(api_env):
    c = TrainhubClient()
    assert c.url == api_env.url and c.list()["items"] == []
    assert c.whoami() == "alice"
