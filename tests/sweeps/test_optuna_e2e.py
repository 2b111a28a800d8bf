"""A user's sweeps in Optuna's own tools, through a real `trainhub up` (as root: own accounts, sandboxes): the copy
of alice's studies in her home opens with ``optuna.load_study(storage=trainhub.optuna_storage())`` in her kernel,
with the trials' values the API shows; bob's kernel cannot read her copy and his own lists only his sweep; the
dashboard answers through her server's proxy, and the hub refuses bob there."""

from __future__ import annotations

import json
import uuid

import optuna
import pytest
import requests
from waiting import wait_for

from trainhub.runtime import OPTUNA_COPY
from trainhub.states import SWEEP_TERMINAL

pytestmark = pytest.mark.e2e

TRIAL = "import trainhub\ntrainhub.report(step=0, loss=(trainhub.params()['x'] - 0.3) ** 2)\n"


def run_sweep(platform, user: str, trials: int) -> tuple[str, dict]:
    url = platform.url + "/services/trainhub/api"
    h = {"Authorization": f"token {platform.token(user)}"}
    r = requests.post(url + "/sweeps", headers=h, timeout=60,
                      json={"script": TRIAL, "gpus": 0, "trials": trials, "parallel": trials, "metric": "loss",
                            "mode": "min", "space": {"x": "uniform:0:1"}, "sampler": "random", "pruner": "none"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    wait_for(lambda: requests.get(f"{url}/sweeps/{sid}", headers=h, timeout=30).json(),
             lambda s: s["state"] in SWEEP_TERMINAL, what=f"sweep {sid} to end", timeout=240)
    items = requests.get(f"{url}/sweeps/{sid}/trials", headers=h, timeout=30).json()["items"]
    return sid, {t["number"]: t["value"] for t in items}


def copy_has(platform, user: str, sid: str, n: int):
    path = platform.data_dir / "homes" / user / OPTUNA_COPY

    def done():
        try:
            t = optuna.load_study(study_name=sid, storage=f"sqlite:///{path}").trials
        except Exception:
            return False
        return len(t) == n and all(x.state.is_finished() for x in t)

    wait_for(done, what=f"{user}'s copy to hold {sid}", timeout=60)


def test_own_studies_in_optuna_tools_and_no_one_elses(platform):
    tag = uuid.uuid4().hex[:6]
    alice, bob = f"opt-alice-{tag}", f"opt-bob-{tag}"
    platform.spawn(alice, profile=None)
    platform.spawn(bob, profile=None)
    try:
        sid, values = run_sweep(platform, alice, 3)
        bob_sid, _ = run_sweep(platform, bob, 1)
        copy_has(platform, alice, sid, 3)
        copy_has(platform, bob, bob_sid, 1)

        # (1) alice's kernel opens her study with Optuna, with the values the API shows
        out = platform.kernel_exec(alice, "import json, optuna, trainhub\n"
                                   f"s = optuna.load_study(study_name={sid!r}, storage=trainhub.optuna_storage())\n"
                                   "print('VALUES', json.dumps({t.number: t.value for t in s.trials}))\n"
                                   "print('NAMES', json.dumps([x.study_name for x in optuna.get_all_study_summaries(trainhub.optuna_storage())]))\n")
        got = json.loads(out.split("VALUES ", 1)[1].splitlines()[0])
        assert {int(k): v for k, v in got.items()} == values
        assert json.loads(out.split("NAMES ", 1)[1].splitlines()[0]) == [sid]

        # (2) bob cannot read her copy; his own storage lists only his sweep
        alice_copy = platform.data_dir / "homes" / alice / OPTUNA_COPY
        out = platform.kernel_exec(bob, "import json, optuna, trainhub\n"
                                   f"try:\n    open({str(alice_copy)!r}, 'rb').read(16); print('READ')\n"
                                   "except OSError as e:\n    print('REFUSED', type(e).__name__)\n"
                                   "print('NAMES', json.dumps([x.study_name for x in optuna.get_all_study_summaries(trainhub.optuna_storage())]))\n")
        assert "REFUSED" in out and "READ" not in out.replace("REFUSED", "")
        assert json.loads(out.split("NAMES ", 1)[1].splitlines()[0]) == [bob_sid]

        # (3) the dashboard answers through alice's server, and the hub refuses bob there
        h = {"Authorization": f"token {platform.token(alice)}"}
        r = requests.get(f"{platform.url}/user/{alice}/trainhub/optuna/open?sweep={sid}", headers=h, timeout=120)
        assert r.status_code == 200 and "Optuna Dashboard" in r.text, (r.status_code, r.text[:300])
        prefix = r.url.split("/dashboard", 1)[0]
        studies = requests.get(prefix + "/api/studies", headers=h, timeout=30).json()["study_summaries"]
        assert [s["study_name"] for s in studies] == [sid]
        hb = {"Authorization": f"token {platform.token(bob)}"}
        for url in (f"{platform.url}/user/{alice}/trainhub/optuna/open?sweep={sid}", prefix + "/api/studies"):
            rb = requests.get(url, headers=hb, timeout=30, allow_redirects=False)
            assert rb.status_code in (302, 403, 404) and sid not in rb.text, (url, rb.status_code)
            if rb.status_code == 302:  # to the hub's login / oauth, never to the dashboard
                assert "/proxy/" not in rb.headers["Location"]
    finally:
        platform.stop_server(alice)
        platform.stop_server(bob)
