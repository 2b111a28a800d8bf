"""TensorBoard for jobs: event files written under ``trainhub.tensorboard_dir()`` in a job, gathered one run per
job (``trainhub.tensorboard.gather``, local folder and real S3), opened through the user's own server
(``trainhub.extensions.tensorboard`` behind jupyter-server-proxy) in a real `trainhub up`, and by the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
import pytest
import requests

from trainhub import tensorboard as tb
from trainhub.exceptions import InvalidRequest
from trainhub.states import JOB_TERMINAL
from waiting import wait_for

WRITER = r'''
import trainhub
from torch.utils.tensorboard import SummaryWriter
w = SummaryWriter(str(trainhub.tensorboard_dir()))
for step in range(5):
    w.add_scalar("loss", 1.0 / (step + 1), step)
w.close()
print("wrote", sorted(p.name for p in trainhub.tensorboard_dir().iterdir()), flush=True)
'''


def _events(folder, scalars=3):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(folder))
    for step in range(scalars):
        w.add_scalar("acc", step / 10, step)
    w.close()
    return sorted(folder.iterdir())


def _wait_job(api, h, job_id):
    return wait_for(lambda: requests.get(f"{api}/jobs/{job_id}", headers=h, timeout=30).json(),
                    lambda j: j["state"] in JOB_TERMINAL, what=f"job {job_id} to end", interval=0.5, timeout=180)


def _job(job_id, area, name=None):
    return {"id": job_id, "name": name, "outputs_url": str(area) if area else None}


def test_gather_one_run_per_job_copies_only_what_changed(tmp_path):
    pytest.importorskip("torch")
    a, b = tmp_path / "areas" / "a", tmp_path / "areas" / "b"
    _events(a / tb.EVENTS_REL)
    _events(b / tb.EVENTS_REL / "train")
    jobs = [_job("j-000001", a, "resnet 50!"), _job("j-000002", b), _job("j-000003", tmp_path / "none"), _job("j-4", None)]
    logdir = tmp_path / "logdir"
    got = tb.gather(jobs, logdir)
    assert sorted(p.name for p in logdir.iterdir()) == ["j-000001-resnet-50", "j-000002"]
    assert got.files == 2 and got.copied == 2 and got.empty == ["j-000003", "j-4"]
    assert [p.parent.name for p in (logdir / "j-000002").rglob("events.out.tfevents.*")] == ["train"]
    again = tb.gather(jobs, logdir)
    assert again.files == 2 and again.copied == 0
    _events(a / tb.EVENTS_REL, scalars=1)  # a second writer: a new file
    assert tb.gather(jobs, logdir).copied == 1


def test_gather_is_bounded_and_follows_no_links(tmp_path):
    area = tmp_path / "area"
    events = area / tb.EVENTS_REL
    events.mkdir(parents=True)
    for i in range(5):
        (events / f"events.out.tfevents.{i}").write_bytes(b"x" * 100)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    os.symlink(secret, events / "events.out.tfevents.link")
    logdir = tmp_path / "logdir"
    assert tb.gather([_job("j-1", area)], logdir).files == 5
    assert not any(p.name.endswith("link") for p in logdir.rglob("*"))
    with pytest.raises(InvalidRequest, match="limit of 3 files"):
        tb.gather([_job("j-1", area)], tmp_path / "other", max_files=3)
    with pytest.raises(InvalidRequest, match="open fewer jobs"):
        tb.gather([_job("j-1", area)], tmp_path / "other", max_bytes=250)


def test_gather_from_s3(tmp_path, s3_server):
    bucket = s3_server.make_bucket()
    fs = s3_server.filesystem()
    fs.pipe(f"{bucket}/users/u/jobs/j-9/{tb.EVENTS_REL}/events.out.tfevents.1", b"abc")
    got = tb.gather([_job("j-9", f"s3://{bucket}/users/u/jobs/j-9")], tmp_path / "logdir", {"endpoint_url": s3_server.endpoint, "key": s3_server.key, "secret": s3_server.secret})
    assert got.copied == 1 and (tmp_path / "logdir" / "j-9" / "events.out.tfevents.1").read_bytes() == b"abc"


@pytest.mark.e2e
def test_tensorboard_through_the_users_server(platform):
    pytest.importorskip("torch")
    from trainhub.extensions import install_labextension

    install_labextension()  # servers of this environment load the extensions (what `trainhub up` does)
    user, other = "tb-ann", "tb-ben"
    api = platform.url + "/services/trainhub/api"
    h = {"Authorization": f"token {platform.token(user)}"}
    theirs = requests.post(api + "/jobs", json={"command": "true", "gpus": 0}, timeout=30,
                           headers={"Authorization": f"token {platform.token(other)}"}).json()
    job = requests.post(api + "/jobs", json={"script": WRITER, "gpus": 0, "name": "curves"}, headers=h, timeout=30).json()
    done = _wait_job(api, h, job["id"])
    assert done["state"] == "succeeded", requests.get(f"{api}/jobs/{job['id']}/logs", headers=h, timeout=30).text
    platform.spawn(user, "cpu")
    try:
        base = f"{platform.url}/user/{user}/trainhub/tensorboard"
        assert requests.get(base, headers=h, timeout=30).json() == {"available": True}
        # bad input and other users' jobs: clear 4xx, nothing started
        assert requests.post(base, data=b"[", headers=h, timeout=30).status_code == 400
        assert requests.post(base, json={"jobs": "j-1"}, headers=h, timeout=30).status_code == 400
        assert requests.post(base, json={"jobs": ["../x"]}, headers=h, timeout=30).status_code == 400
        assert requests.post(base, json={"jobs": [f"j-{i}" for i in range(100)]}, headers=h, timeout=30).status_code == 400
        r = requests.post(base, json={"jobs": [theirs["id"]]}, headers=h, timeout=30)
        assert r.status_code == 404 and "no job" in r.json()["message"], r.text
        r = requests.post(base, json={"jobs": [job["id"]]}, headers=h, timeout=120)
        assert r.status_code == 201, r.text
        url = r.json()["url"]
        assert url.startswith(f"/user/{user}/proxy/absolute/") and r.json()["jobs"] == [job["id"]]
        page = requests.get(platform.url + url, headers=h, timeout=60)
        assert page.status_code == 200 and "tensorboard" in page.text.lower(), page.text[:300]

        def runs():
            return requests.get(platform.url + url + "data/runs", headers=h, timeout=60).json()

        # TensorBoard loads the logdir in the background
        wait_for(runs, lambda found: found == [f"{job['id']}-curves"], what="TensorBoard to show the job's run",
                 interval=0.5, timeout=90)
        # the same jobs again: the same TensorBoard; a link for notebook output redirects to it
        assert requests.post(base, json={"jobs": [job["id"]]}, headers=h, timeout=60).json()["url"] == url
        r = requests.get(f"{base}/open", params={"jobs": job["id"]}, headers=h, timeout=60, allow_redirects=False)
        assert r.status_code == 302 and r.headers["Location"] == url
        # not through someone else's token
        other_h = {"Authorization": f"token {platform.token(other)}"}
        assert requests.post(base, json={"jobs": [job["id"]]}, headers=other_h, timeout=30,
                             allow_redirects=False).status_code in (302, 403)
    finally:
        platform.stop_server(user)


@pytest.mark.e2e
def test_cli_gathers_and_serves(platform, tmp_path):
    pytest.importorskip("torch")
    user = "tb-cli"
    api = platform.url + "/services/trainhub/api"
    token = platform.token(user)
    h = {"Authorization": f"token {token}"}
    job = requests.post(api + "/jobs", json={"script": WRITER, "gpus": 0}, headers=h, timeout=30).json()
    done = _wait_job(api, h, job["id"])
    env = {k: v for k, v in os.environ.items() if k != "JUPYTERHUB_SERVICE_PREFIX"}
    proc = subprocess.Popen([sys.executable, "-m", "trainhub.cli", "jobs", "tensorboard", job["id"], "--url", api,
                             "--token", token, "--logdir", str(tmp_path / "logdir")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"TensorBoard for {job['id']} (1 event files): http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        where = line.split(": ", 1)[1].split()[0]

        def runs():
            assert proc.poll() is None, proc.stderr.read()
            try:
                return requests.get(where + "data/runs", timeout=10).json()
            except (requests.ConnectionError, ValueError):
                return None

        wait_for(runs, lambda found: found == [tb.run_name(done)], what="the CLI's TensorBoard to show the job's run",
                 interval=0.5, timeout=90)
    finally:
        proc.terminate()
        proc.wait(30)
    # the CLI's SIGTERM stopped its TensorBoard too (it used to keep running, holding its port)
    logdir = str(tmp_path / "logdir")

    def servers() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and logdir in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(entry.name)
            except OSError:
                pass
        return found

    wait_for(servers, lambda pids: not pids, what="the CLI's TensorBoard to stop with it", interval=0.2, timeout=30)
    r = subprocess.run([sys.executable, "-m", "trainhub.cli", "jobs", "tensorboard", "j-999999", "--url", api, "--token", token],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "j-999999" in r.stderr and "Traceback" not in r.stderr
