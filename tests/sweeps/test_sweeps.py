"""Sweeps end to end through a real `trainhub up`: every trial a real job of the jobs service,
Optuna sampling and pruning in the platform database, cancel, a service crash mid-sweep, bad
input refused before anything is submitted, and ``%%sweep`` in a real kernel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
from waiting import wait_for

from trainhub.states import SWEEP_TERMINAL as SWEEP_DONE

pytestmark = pytest.mark.e2e


# a small real objective: gradient descent on a numpy linear regression; lr and weight decay matter
REGRESSION = """
import numpy as np
import trainhub

p = trainhub.params()
rng = np.random.default_rng(0)
X = rng.normal(size=(240, 6))
y = X @ np.linspace(1.0, 3.0, 6) + 0.1 * rng.normal(size=240)
Xt, yt, Xv, yv = X[:180], y[:180], X[180:], y[180:]
w = np.zeros(6)
for step in range(4):
    for _ in range(10):
        w -= p["lr"] * (Xt.T @ (Xt @ w - yt) / len(yt) + p["wd"] * w)
    trainhub.report(step=step, val_loss=float(np.mean((Xv @ w - yv) ** 2)))
"""


def regression_value(lr: float, wd: float) -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 6))
    y = X @ np.linspace(1.0, 3.0, 6) + 0.1 * rng.normal(size=240)
    Xt, yt, Xv, yv = X[:180], y[:180], X[180:], y[180:]
    w = np.zeros(6)
    for _ in range(40):
        w -= lr * (Xt.T @ (Xt @ w - yt) / len(yt) + wd * w)
    return float(np.mean((Xv @ w - yv) ** 2))


class Sweeps:
    def __init__(self, platform, user):
        self.platform = platform
        self.user = user
        self.url = platform.url + "/services/trainhub/api"
        self.token = platform.token(user)
        self.h = {"Authorization": f"token {self.token}"}

    def create(self, **body) -> requests.Response:
        return requests.post(self.url + "/sweeps", json=body, headers=self.h, timeout=60)

    def start(self, **body) -> dict:
        r = self.create(**body)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, sid) -> dict:
        r = requests.get(f"{self.url}/sweeps/{sid}", headers=self.h, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def trials(self, sid) -> list[dict]:
        r = requests.get(f"{self.url}/sweeps/{sid}/trials", headers=self.h, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["items"]

    def cancel(self, sid) -> requests.Response:
        return requests.delete(f"{self.url}/sweeps/{sid}", headers=self.h, timeout=30)

    def job(self, jid) -> dict:
        return requests.get(f"{self.url}/jobs/{jid}", headers=self.h, timeout=30).json()

    def jobs_total(self) -> int:
        return requests.get(f"{self.url}/jobs", params={"limit": 1}, headers=self.h, timeout=30).json()["total"]

    def wait(self, sid, until=lambda s: s["state"] in SWEEP_DONE, timeout=120, what="to end") -> dict:
        def fetch():
            try:
                return self.get(sid)
            except (requests.RequestException, AssertionError):
                return None  # the service may be restarting

        return wait_for(fetch, lambda s: s is not None and until(s), what=f"sweep {sid} to {what}", timeout=timeout,
                        interval=0.3, describe=lambda s: f"{s}\n{self.trials(sid) if s else ''}")


def test_sweep_over_a_numpy_regression_beats_random_configs(platform):
    sw = Sweeps(platform, "sweep-reg")
    s = sw.start(name="reg", script=REGRESSION, gpus=0, trials=8, parallel=2, metric="val_loss", mode="min",
                 sampler="tpe", pruner="none", seed=7,
                 space={"lr": "loguniform:1e-4:0.5", "wd": "loguniform:1e-6:1e-1"})
    assert s["id"].startswith("s-") and s["state"] == "running" and s["trials"] == 8 and s["parallel"] == 2
    peaks = [0]

    def look(sid=s["id"]):
        s = sw.get(sid)
        peaks.append(s["progress"]["running"] + s["progress"]["pending"])
        return s

    s = wait_for(look, lambda s: s["state"] in SWEEP_DONE, what="the regression sweep to end", timeout=150)
    peak = max(peaks)
    assert s["state"] == "completed", s
    assert peak <= 2
    trials = sw.trials(s["id"])
    assert len(trials) == 8 and all(t["state"] == "complete" for t in trials), trials
    # each trial is a real job of the service, with its params
    for t in trials:
        job = sw.job(t["job_id"])
        assert job["state"] == "succeeded" and job["params"] == t["params"] and job["sweep_id"] is not None
        assert len(t["intermediate"]) == 4 and t["value"] == t["intermediate"][-1][1]
        assert abs(t["value"] - regression_value(**t["params"])) < 1e-9
    best = s["best"]
    assert best["value"] == min(t["value"] for t in trials)
    assert best["job_id"] and best["outputs_path"] and set(best["params"]) == {"lr", "wd"}
    # better than a random configuration: below the median of 300 random draws from the same space
    import numpy as np

    rng = np.random.default_rng(1)
    randoms = sorted(regression_value(10 ** rng.uniform(-4, np.log10(0.5)), 10 ** rng.uniform(-6, -1)) for _ in range(300))
    assert best["value"] < randoms[len(randoms) // 2], (best, randoms[150])
    assert s["importance"] and set(s["importance"]) == {"lr", "wd"}
    listed = requests.get(sw.url + "/sweeps", headers=sw.h, timeout=30).json()
    assert [x["id"] for x in listed["items"]] == [s["id"]]
    jobs = requests.get(sw.url + "/jobs", params={"sweep": int(s["id"][2:])}, headers=sw.h, timeout=30).json()
    assert jobs["total"] == 8


# good trials (x < 0.5) report 0.1 for 30 quick steps; bad ones report 1.0 every 0.5 s for 15 s
PRUNABLE = """
import time
import trainhub

x = trainhub.params()["x"]
bad = x >= 0.5
for step in range(30):
    trainhub.report(step=step, val_loss=1.0 if bad else 0.1)
    time.sleep(0.5 if bad else 0.02)
"""


def test_pruning_stops_bad_trials_early_and_frees_their_gpus(platform):
    import optuna
    from optuna.distributions import FloatDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    local = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    xs = [local.ask({"x": FloatDistribution(0, 1)}).params["x"] for _ in range(6)]
    assert xs[0] < 0.5 and sum(x >= 0.5 for x in xs) >= 2, f"seed 5 no longer gives a good first trial: {xs}"

    sw = Sweeps(platform, "sweep-prune")
    s = sw.start(name="prune", script=PRUNABLE, gpus=1, trials=6, parallel=2, metric="val_loss", mode="min",
                 sampler="random", seed=5, pruner="median", startup_trials=1, space={"x": "uniform:0:1"})
    s = sw.wait(s["id"], timeout=120)
    assert s["state"] == "completed", s
    trials = sw.trials(s["id"])
    assert [round(t["params"]["x"], 9) for t in trials] == [round(x, 9) for x in xs]
    pruned = [t for t in trials if t["state"] == "pruned"]
    assert len(pruned) == sum(x >= 0.5 for x in xs), trials
    for t in pruned:
        assert t["params"]["x"] >= 0.5 and "pruned at step" in t["reason"], t
        job = sw.job(t["job_id"])
        assert job["state"] == "cancelled", job
        # stopped early, not run to its end: killed by a signal before its last step (29) was reported
        steps = [step for step, _ in t["intermediate"]]
        assert steps and max(steps) < 29, f"pruned trial {t['number']} reported steps {steps}: {job}"
        assert job["exit_codes"] and all(c < 0 for c in job["exit_codes"]), job
    assert all(t["state"] == "complete" for t in trials if t["params"]["x"] < 0.5), trials
    assert s["progress"]["pruned"] == len(pruned) and s["best"]["value"] == 0.1
    # pruned trials freed their slots at once: their jobs were cancelled (above), not left to run out, and the
    # sweep completed with every trial run (the sweep's speed is benchmarks/sweep_bench.py's)
    assert platform.held_by("sweep-prune") == []  # every GPU went back to the pool


QUICK = """
import time
import trainhub

trainhub.report(step=0, val_loss=trainhub.params()["x"])
time.sleep(2)
trainhub.report(step=1, val_loss=trainhub.params()["x"] / 2)
"""


def test_trials_are_held_to_the_gpu_quota(platform):
    """parallel 4 with 1 GPU each, but the user's quota is 2: never more than 2 trials run at once."""
    sw = Sweeps(platform, "sweep-quota")
    s = sw.start(name="quota", script=QUICK, gpus=1, trials=4, parallel=4, metric="val_loss", mode="min",
                 pruner="none", space={"x": "uniform:0:1"})
    seen = {"peak_running": 0, "peak_unfinished": 0, "waited_for_quota": False}

    def look(sid=s["id"]):
        s = sw.get(sid)
        jobs = requests.get(sw.url + "/jobs", params={"sweep": int(sid[2:])}, headers=sw.h, timeout=30).json()["items"]
        running = [j for j in jobs if j["state"] == "running"]
        seen["peak_running"] = max(seen["peak_running"], len(running))
        seen["peak_unfinished"] = max(seen["peak_unfinished"], sum(j["state"] in ("queued", "running") for j in jobs))
        seen["waited_for_quota"] |= any(j["state"] == "queued" and "quota" in j["reason"].lower() for j in jobs)
        assert sum(len(j["devices"][0]) for j in running if j["devices"]) <= 2
        return s

    s = wait_for(look, lambda s: s["state"] in SWEEP_DONE, what="the quota sweep to end", timeout=90)
    peak_running, peak_unfinished, waited_for_quota = seen["peak_running"], seen["peak_unfinished"], seen["waited_for_quota"]
    assert s["state"] == "completed" and s["progress"]["complete"] == 4, s
    assert peak_running == 2 and peak_unfinished == 4 and waited_for_quota
    assert platform.held_by("sweep-quota") == []


SLOW = """
import time
import trainhub

trainhub.report(step=0, val_loss=trainhub.params()["x"])
time.sleep(60)
trainhub.report(step=1, val_loss=0.0)
"""


def test_cancel_stops_running_trials_and_starts_no_more(platform):
    sw = Sweeps(platform, "sweep-cancel")
    s = sw.start(name="cancel-me", script=SLOW, gpus=0, trials=5, parallel=2, metric="val_loss", mode="min",
                 pruner="none", space={"x": "uniform:0:1"})
    sw.wait(s["id"], until=lambda s: s["progress"]["running"] == 2, timeout=60, what="run 2 trials")
    wait_for(lambda: [sw.job(t["job_id"])["state"] for t in sw.trials(s["id"])],
             lambda states: all(st == "running" for st in states), what="both trials' jobs to run", timeout=30)
    r = sw.cancel(s["id"])
    assert r.status_code == 202, r.text
    s = sw.wait(s["id"], timeout=30)
    assert s["state"] == "cancelled" and "sweep-cancel" in s["reason"], s
    trials = sw.trials(s["id"])
    assert len(trials) == 2 and all(t["state"] == "cancelled" for t in trials), trials
    for t in trials:
        job = sw.job(t["job_id"])
        assert job["state"] == "cancelled"
        # stopped, not waited for: killed by a signal, its 60 s sleep never ran out
        assert job["exit_codes"] and all(c < 0 for c in job["exit_codes"]), job
    # a later pass of the controller (it steps running sweeps one pass after another) has started a trial of
    # another sweep: by then a new trial of the cancelled one would have been started too
    after = sw.start(name="after-cancel", script=QUICK, gpus=0, trials=1, parallel=1, metric="val_loss", mode="min",
                     pruner="none", space={"x": "uniform:0:1"})
    sw.wait(after["id"], until=lambda a: a["progress"]["running"] + a["progress"]["complete"] >= 1, timeout=60,
            what="start its trial")
    assert len(sw.trials(s["id"])) == 2  # nothing new was started
    sw.cancel(after["id"])
    assert sw.cancel(s["id"]).status_code == 202  # cancelling an ended sweep changes nothing
    assert sw.get(s["id"])["state"] == "cancelled"


STEADY = """
import time
import trainhub

x = trainhub.params()["x"]
for step in range(6):
    trainhub.report(step=step, val_loss=(x - 0.5) ** 2 + 1.0 / (step + 1))
    time.sleep(0.4)
"""


def jobs_service_pid(platform) -> int:
    pids = subprocess.check_output(["pgrep", "-f", "trainhub.services.jobs"], text=True).split()
    mine = []
    for p in pids:
        try:
            if f"TRAINHUB_DATA_DIR={platform.data_dir}".encode() in Path(f"/proc/{p}/environ").read_bytes():
                mine.append(int(p))
        except OSError:
            pass
    assert len(mine) == 1, mine
    return mine[0]


def test_sweep_resumes_after_the_service_is_killed(platform):
    sw = Sweeps(platform, "sweep-crash")
    s = sw.start(name="crash", script=STEADY, gpus=0, trials=6, parallel=2, metric="val_loss", mode="min",
                 sampler="random", seed=3, pruner="none", space={"x": "uniform:0:1"})
    sw.wait(s["id"], until=lambda s: s["progress"]["complete"] >= 2, timeout=90, what="complete 2 trials")
    before = {t["number"]: t for t in sw.trials(s["id"]) if t["state"] == "complete"}
    os.kill(jobs_service_pid(platform), signal.SIGKILL)
    s = sw.wait(s["id"], timeout=150)  # JupyterHub restarts its managed service; the sweep carries on
    assert s["state"] == "completed", s
    trials = sw.trials(s["id"])
    assert len(trials) == 6 and all(t["state"] == "complete" for t in trials), trials
    after = {t["number"]: t for t in trials}
    for n, t in before.items():  # finished trials kept: same job, same value
        assert (after[n]["job_id"], after[n]["value"], after[n]["params"]) == (t["job_id"], t["value"], t["params"])
    jobs = requests.get(sw.url + "/jobs", params={"sweep": int(s["id"][2:])}, headers=sw.h, timeout=30).json()
    assert jobs["total"] == 6, [j["id"] for j in jobs["items"]]  # no trial submitted twice
    assert all(j["state"] == "succeeded" for j in jobs["items"])


GOOD_SCRIPT = "import trainhub\ntrainhub.report(step=0, val_loss=trainhub.params()['lr'])\n"


@pytest.mark.parametrize("change, status, message", [
    ({"mode": None}, 400, "mode is required: 'min' or 'max' (does a smaller or a larger val_loss win?)"),
    ({"mode": "lowest"}, 400, "mode must be 'min' or 'max', not 'lowest'"),
    ({"metric": None}, 400, "metric is required"),
    ({"trials": None}, 400, "trials is required"),
    ({"space": {"lr": "normal:0:1"}}, 400, "parameter 'lr': unknown distribution 'normal'; use one of uniform, loguniform, int, logint, choice"),
    ({"space": {"lr": "uniform:1:1"}}, 400, "parameter 'lr': empty range: LOW (1) must be less than HIGH (1)"),
    ({"space": {"lr": "int:5:2"}}, 400, "parameter 'lr': empty range: LOW (5) must be less than HIGH (2)"),
    ({"space": {"lr": "loguniform:0:1"}}, 400, "parameter 'lr': loguniform needs LOW > 0 (got 0)"),
    ({"space": {"lr": "choice:"}}, 400, "parameter 'lr': choice needs at least one value"),
    ({"space": {}}, 400, "the search space is empty"),
    ({"script": "import trainhub\ntrainhub.report(step=0, loss=1.0)\n"}, 400,
     "metric 'val_loss' is never reported by the trial code: call trainhub.report(step=..., val_loss=...)"),
    ({"sampler": "grid"}, 400, "the grid sampler needs discrete parameters: lr is continuous"),
    ({"sampler": "annealing"}, 400, "unknown sampler 'annealing'"),
    ({"sampler": "grid", "space": {"a": "int:0:999999999999", "b": "choice:x,y"}}, 400,
     "the grid has 2,000,000,000,000 points; at most 100,000 are allowed"),
    ({"space": {"opt": [f"v{i}" for i in range(5000)]}}, 400, "parameter 'opt': choice lists 5000 values; at most 1000"),
    ({"gpus": 3}, 403, "GPU quota exceeded: each trial needs 3 GPUs"),
    ({"gpus": 1, "workers": 5}, 409, "each trial needs 5 GPUs (5 worker(s) × 1) but the pool has only 4"),
    ({"bogus": 1}, 400, "unknown field(s) ['bogus']"),
])
def test_bad_input_is_refused_before_anything_is_submitted(platform, change, status, message):
    sw = Sweeps(platform, "sweep-bad")
    jobs_before = sw.jobs_total()
    body = {"script": GOOD_SCRIPT, "gpus": 0, "trials": 2, "metric": "val_loss", "mode": "min",
            "space": {"lr": "loguniform:1e-5:1e-1"}}
    body.update(change)
    r = sw.create(**{k: v for k, v in body.items() if v is not None})
    assert r.status_code == status, r.text
    assert r.json()["status"] == status and message in r.json()["message"], r.json()
    assert sw.jobs_total() == jobs_before
    assert requests.get(sw.url + "/sweeps", headers=sw.h, timeout=30).json()["total"] == 0


def test_a_trial_that_never_reports_the_metric_fails_with_that_reason(platform):
    sw = Sweeps(platform, "sweep-silent")
    s = sw.start(name="silent", script="import trainhub\ntrainhub.report(step=0, loss=1.0)\n", check_metric=False,
                 gpus=0, trials=2, parallel=2, metric="val_loss", mode="min", space={"lr": "uniform:0:1"})
    s = sw.wait(s["id"], timeout=60)
    assert s["state"] == "failed" and s["best"] is None, s
    trials = sw.trials(s["id"])
    assert len(trials) == 2
    for t in trials:
        assert t["state"] == "failed" and t["reason"].startswith("metric 'val_loss' was never reported"), t
        assert sw.job(t["job_id"])["state"] == "succeeded"  # the job itself ran fine
    # another user's sweep is not revealed
    other = Sweeps(platform, "sweep-other")
    for method in ("GET", "DELETE"):
        r = requests.request(method, f"{other.url}/sweeps/{s['id']}", headers=other.h, timeout=30)
        assert r.status_code == 404 and r.json()["message"] == f"sweep {s['id']} not found"
    assert requests.get(other.url + "/sweeps", headers=other.h, timeout=30).json()["total"] == 0


def test_cli_grid_sweep_maximises_and_reports_the_best_trial(platform, tmp_path):
    sw = Sweeps(platform, "sweep-cli")
    base = ["--url", sw.url, "--token", sw.token]

    def cli(*args, check=True):
        r = subprocess.run([sys.executable, "-m", "trainhub.cli", "sweeps", *args, *base],
                           capture_output=True, text=True, timeout=120, cwd=str(Path(__file__).resolve().parents[2]),
                           env=platform.env)
        assert not check or r.returncode == 0, r.stdout + r.stderr
        return r

    script = tmp_path / "objective.py"
    script.write_text("import trainhub\nx = trainhub.params()['x']\ntrainhub.report(step=0, score=-(x - 2) ** 2)\n")
    r = cli("create", str(script), "--trials", "4", "--parallel", "2", "--metric", "score", "--mode", "max",
            "--sampler", "grid", "--param", "x=int:0:3", "--gpus", "0", "--wait")
    assert "best:      score = 0" in r.stdout and '"x": 2' in r.stdout, r.stdout
    sid = r.stdout.split("started sweep ", 1)[1].split(":")[0]
    listed = cli("list").stdout
    assert sid in listed and "completed" in listed
    shown = cli("show", sid).stdout
    assert shown.count("complete") >= 4 and "grid sampler" in shown
    best = json.loads(cli("best", sid, "--json").stdout)
    assert best["params"] == {"x": 2} and best["value"] == 0 and best["job_id"]
    bad = cli("create", str(script), "--trials", "2", "--metric", "score", "--mode", "max", "--param", "x=int:3:1", check=False)
    assert bad.returncode == 2 and "empty range: LOW (3) must be less than HIGH (1)" in bad.stderr
    assert cli("cancel", sid).returncode == 0


def test_sweep_magic_in_a_kernel_runs_the_cell_with_its_notebook_context(platform, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    user = f"sweep-nb-{uuid.uuid4().hex[:6]}"
    sw = Sweeps(platform, user)
    nb = nbformat.v4.new_notebook()
    cells = [
        ("%load_ext trainhub.kernels", []),
        ("def objective(x):\n    return (x - 0.3) ** 2\n", []),
        ("%%sweep --trials 2 --metric loss --param x=uniform:0:1 --gpus 0\nimport trainhub\n"
         "trainhub.report(loss=objective(trainhub.params()['x']))\n", ["raises-exception"]),
        ("%%sweep --trials 3 --parallel 3 --metric loss --mode min --pruner none --seed 1 --gpus 0 --wait --as sw\n"
         "import trainhub\nsearch_space = {'x': 'uniform:0:1'}\n"
         "trainhub.report(step=0, loss=objective(trainhub.params()['x']))\n", []),
        ("b = sw.best_trial\nprint('RESULT', sw.status, b.value, b.job_id, len(sw.trials))", []),
    ]
    nb.cells = [nbformat.v4.new_code_cell(src, metadata={"tags": tags}) for src, tags in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    env = dict(os.environ, TRAINHUB_API_URL=sw.url, JUPYTERHUB_API_TOKEN=sw.token, JUPYTERHUB_USER=user)
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)

    def text(cell):
        out = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o["text"])
            elif o.get("output_type") == "error":
                out.append(f"{o['ename']}: {o['evalue']}")
        return "".join(out)

    assert "--mode is required: min or max (does a smaller or a larger loss win?)" in text(nb.cells[2])
    out = text(nb.cells[4])
    assert "RESULT completed" in out, [text(c) for c in nb.cells]
    value = float(out.split("RESULT completed ", 1)[1].split()[0])
    sweeps = requests.get(sw.url + "/sweeps", headers=sw.h, timeout=30).json()
    assert sweeps["total"] == 1  # the refused cell submitted nothing
    s = sweeps["items"][0]
    assert s["best"]["value"] == value and s["progress"]["complete"] == 3
    job = sw.job(s["best"]["job_id"])
    assert "def objective" in job["script"] and job["params"] == s["best"]["params"]


def test_sweep_trials_run_in_a_copy_of_the_notebooks_folder(platform, tmp_path):
    """Issue 34: ``%%sweep`` in a kernel whose notebook's folder holds ``objhelpers.py`` sends the folder once; every
    trial (a job of the real service, as the user) imports the module from its own copy and reads a relative path. A
    sweep naming a working directory the caller never sent, or another user's, is refused (404) and starts nothing."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    user = f"sweep-wd-{uuid.uuid4().hex[:6]}"
    sw = Sweeps(platform, user)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "objhelpers.py").write_text("def objective(x):\n    return (x - 0.3) ** 2\n")
    (folder / "scale.txt").write_text("10\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext trainhub.kernels",
        "%%sweep --trials 2 --parallel 2 --metric loss --mode min --pruner none --seed 1 --gpus 0 --wait --as sw\n"
        "import os, trainhub\nfrom objhelpers import objective\nscale = int(open('scale.txt').read())\n"
        "print('TRIAL', trainhub.params()['x'], 'in', os.path.basename(os.getcwd()), sorted(os.listdir('.')))\n"
        "search_space = {'x': 'uniform:0:1'}\n"
        "trainhub.report(step=0, loss=scale * objective(trainhub.params()['x']))\n",
        "print('RESULT', sw.status, len(sw.trials))",
    )]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    env = dict(os.environ, TRAINHUB_API_URL=sw.url, JUPYTERHUB_API_TOKEN=sw.token, JUPYTERHUB_USER=user)
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(folder)}})
    client.execute(env=env)
    outs = ["".join(o.get("text", "") for o in c.get("outputs", []) if o.get("output_type") == "stream") for c in nb.cells]
    assert f"%%sweep sent the working directory {folder} (each trial runs in a copy): 2 files" in outs[1], outs
    assert "RESULT completed 2" in outs[2], outs
    s, = requests.get(sw.url + "/sweeps", headers=sw.h, timeout=30).json()["items"]
    sha = s["job"]["workdir"]
    assert len(sha) == 64 and s["progress"]["complete"] == 2, s
    for t in sw.trials(s["id"]):
        logs = requests.get(f"{sw.url}/jobs/{t['job_id']}/logs", headers=sw.h, timeout=30).text
        assert f"TRIAL {t['params']['x']} in " in logs and "'objhelpers.py', 'scale.txt']" in logs, logs  # (+ __pycache__)
        assert t["value"] == pytest.approx(10 * (t["params"]["x"] - 0.3) ** 2)
    # the REST API: the workdir must be the caller's own upload, as a job's
    body = {"script": GOOD_SCRIPT, "gpus": 0, "trials": 1, "metric": "val_loss", "mode": "min",
            "space": {"lr": "loguniform:1e-5:1e-1"}}
    other = Sweeps(platform, f"sweep-wd-other-{uuid.uuid4().hex[:6]}")
    for who, digest in ((sw, "0" * 64), (other, sha)):
        r = who.create(**body, workdir=digest)
        assert r.status_code == 404 and f"no working directory {digest} is stored for {who.user}" in r.json()["message"], r.text
    assert requests.get(other.url + "/sweeps", headers=other.h, timeout=30).json()["total"] == 0
    assert requests.get(sw.url + "/sweeps", headers=sw.h, timeout=30).json()["total"] == 1


def test_cli_sweep_sends_a_working_directory_every_trial_runs_in(platform, tmp_path):
    """`trainhub sweeps create --workdir DIR` (as `jobs submit --workdir`): the folder goes once, --exclude leaves out
    what it matches, and every trial imports its module and reads its relative paths from its own copy."""
    sw = Sweeps(platform, f"sweep-cliwd-{uuid.uuid4().hex[:6]}")
    folder = tmp_path / "proj"
    (folder / "data").mkdir(parents=True)
    (folder / "objhelpers.py").write_text("def objective(x):\n    return (x - 1) ** 2\n")
    (folder / "offset.txt").write_text("5\n")
    (folder / "data" / "big.bin").write_bytes(b"\0" * 1024)
    (folder / "trial.py").write_text(
        "import os, trainhub\nfrom objhelpers import objective\nx = trainhub.params()['x']\n"
        "print('TRIAL', x, sorted(os.listdir('.')))\n"
        "trainhub.report(step=0, loss=objective(x) + int(open('offset.txt').read()))\n")
    r = subprocess.run([sys.executable, "-m", "trainhub.cli", "sweeps", "create", str(folder / "trial.py"),
                        "--workdir", str(folder), "--exclude", "data/", "--trials", "2", "--parallel", "2",
                        "--metric", "loss", "--mode", "min", "--sampler", "grid", "--pruner", "none", "--param", "x=int:0:1",
                        "--gpus", "0",
                        "--wait", "--url", sw.url, "--token", sw.token],
                       capture_output=True, text=True, timeout=180, env=platform.env)
    s, = requests.get(sw.url + "/sweeps", headers=sw.h, timeout=30).json()["items"]
    logs = {t["job_id"]: requests.get(f"{sw.url}/jobs/{t['job_id']}/logs", headers=sw.h, timeout=30).text
            for t in sw.trials(s["id"])}
    assert r.returncode == 0, (r.stdout + r.stderr, logs)
    assert f"working directory {folder} (each trial runs in a copy): 3 files" in r.stderr, r.stderr  # data/ left out
    assert len(s["job"]["workdir"]) == 64 and s["progress"]["complete"] == 2, s
    for t in sw.trials(s["id"]):
        log = logs[t["job_id"]]
        assert f"TRIAL {t['params']['x']} " in log and "'objhelpers.py', 'offset.txt', 'trial.py'" in log, log
        assert "data" not in log.split("TRIAL", 1)[1].split("]", 1)[0]
        assert t["value"] == (t["params"]["x"] - 1) ** 2 + 5
