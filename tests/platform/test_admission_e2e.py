"""Admission end to end through a real `trainhub up`: one rule (trainhub.quotas), the same 403 text
from every door.

- A CPU-only job over the user's CPU worker quota is refused with the same message by the jobs
  REST API, `trainhub jobs submit` and `%%train` (the shared platform's config gives
  ``adm-cpu`` a quota of 2 CPU-only workers); within the quota it runs, and a second job that
  would pass it waits in the queue (``quota-cpu``) until the first ends.
- A notebook server over the GPU quota is refused with the same message by the hub's REST API and
  the spawn form, as JupyterHub's SpawnException (reason "quota" in the hub's log and its spawn
  metrics), and the user is not left pending.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests
from waiting import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_cpu_job_over_the_cpu_quota_is_refused_alike_by_api_cli_and_train_magic(platform, shell, monkeypatch, capsys):
    user = "adm-cpu"  # QuotaPolicy.user_cpu_worker_limits = {"adm-cpu": 2} in the platform's config
    token = platform.token(user)
    api = platform.url + "/services/trainhub/api"
    h = {"Authorization": f"token {token}"}
    expected = ("CPU quota exceeded: this job needs 3 CPU-only worker processes but your quota is 2. "
                "Ask for fewer workers, or ask an admin to raise your quota.")

    r = requests.post(api + "/jobs", json={"command": "true", "workers": 3, "gpus": 0}, headers=h, timeout=30)
    assert r.status_code == 403 and r.json() == {"status": 403, "message": expected}, r.text

    cli = subprocess.run([sys.executable, "-m", "trainhub.cli", "jobs", "submit", "--workers", "3", "--gpus", "0",
                          "--command", "true", "--url", api, "--token", token],
                         capture_output=True, text=True, timeout=60, cwd=str(REPO), env=platform.env)
    assert cli.returncode != 0 and f"{expected} (HTTP 403)" in cli.stderr, (cli.stdout, cli.stderr)

    monkeypatch.setenv("TRAINHUB_API_URL", api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    monkeypatch.setenv("JUPYTERHUB_USER", user)
    magics = shell.magics_manager.registry["TrainMagics"]
    magics.client = None  # built from the environment, as in a platform notebook
    try:
        result = shell.run_cell("%%train --workers 3 --gpus 0\nprint('never runs')\n", store_history=True)
    finally:
        magics.client = None
    err = capsys.readouterr().err
    assert result.error_in_exec is not None
    assert f"the job was not submitted: {expected} (HTTP 403)" in err, err

    listed = requests.get(api + "/jobs", headers=h, timeout=30).json()
    assert listed["total"] == 0  # none of the three submitted anything

    # within the quota it runs; a second job that would pass the quota waits for the first
    first = requests.post(api + "/jobs", json={"command": "sleep 60", "workers": 2, "gpus": 0, "name": "hold"},
                          headers=h, timeout=30).json()
    wait_for(lambda: requests.get(f"{api}/jobs/{first['id']}", headers=h, timeout=30).json()["state"] == "running",
             timeout=60, what="the first CPU job to run")
    second = requests.post(api + "/jobs", json={"command": "echo second", "workers": 1, "gpus": 0},
                           headers=h, timeout=30)
    assert second.status_code == 201, second.text
    sid = second.json()["id"]
    why = wait_for(lambda: (lambda w: w if w.get("code") == "quota-cpu" else None)(
        requests.get(f"{api}/jobs/{sid}/why", headers=h, timeout=30).json()), timeout=30, what="the quota-cpu wait reason")
    assert why["message"] == "over CPU quota: adm-cpu runs 2 of 2 CPU-only workers and this job needs 1"
    assert requests.get(f"{api}/jobs/{sid}", headers=h, timeout=30).json()["state"] == "queued"
    requests.delete(f"{api}/jobs/{first['id']}", headers=h, timeout=30)
    done = wait_for(lambda: (lambda j: j if j["state"] in ("succeeded", "failed", "cancelled", "lost") else None)(
        requests.get(f"{api}/jobs/{sid}", headers=h, timeout=30).json()), timeout=60, what="the second job to end")
    assert done["state"] == "succeeded", done


def test_server_over_the_gpu_quota_is_refused_alike_by_api_and_spawn_form(platform):
    user, password = "adm-srv", "adm-srv-secret-1"
    platform.cli("users", "add", user, "--password", password)
    expected = (f"GPU quota exceeded: {user} holds 2 of 2 GPUs and asked for 1 more. "
                "Stop a server or job, or ask an admin to raise your quota.")
    try:
        platform.spawn(user, "gpu-2", token=platform.token(user))
        r = platform.api("POST", f"/users/{user}/servers/extra", platform.token(user), json={"profile": "gpu-1"})
        assert r.status_code == 403 and r.json()["message"] == expected, r.text
        assert "extra" not in (platform.api("GET", f"/users/{user}").json().get("servers") or {})

        s = platform.login(user, password)
        html = s.post(f"{platform.url}/hub/spawn/{user}/extra", data={"profile": "gpu-1", "_xsrf": s.cookies.get("_xsrf")},
                      timeout=60).text
        assert expected in html
        assert "extra" not in (platform.api("GET", f"/users/{user}").json().get("servers") or {})
        assert len(platform.held_by(user)) == 2

        # the hub saw a SpawnException: logged with the refusal's kind and numbers, counted as a refusal
        wait_for(lambda: "SpawnException(reason=quota): QuotaExceeded(" in platform.log(), timeout=30, what="the refusal in the hub log")
        metrics = requests.get(f"{platform.url}/hub/metrics", headers={"Authorization": f"token {platform.admin_token}"},
                               timeout=30)
        assert metrics.status_code == 200, metrics.text[:300]
        assert any(line.startswith("jupyterhub_server_spawn_duration_seconds_count{")
                   and 'reason="quota"' in line and 'status="failure"' in line
                   for line in metrics.text.splitlines()), "no spawn failure labelled reason=quota"
    finally:
        platform.stop_server(user)
