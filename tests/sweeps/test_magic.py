"""%%sweep in a real in-process IPython shell (client stand-in), the SweepHandle, and the panel's
pure renderers fed canned API answers."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from sweeps_fakes import DONE, SWEEP, TRIALS
from trainhub.fmt import sweep_progress
from trainhub.kernels.sweep import (SweepHandle, render_header, render_plots, render_trials_table,
                                    summary_line, svg_history, svg_importance, svg_intermediate, trial_rows)

CELL = "import trainhub\np = trainhub.params()\ntrainhub.report(step=0, val_loss=helper(p['lr']))\n"


def run(shell, source):
    return shell.run_cell(source, store_history=True)


def test_sweep_magic_sends_the_cell_with_its_context_and_the_space(shell, sweep_magics, fake_client, capsys):
    assert run(shell, "def helper(lr):\n    return (lr - 0.01) ** 2\n").success
    r = run(shell, "%%sweep --trials 6 --parallel 2 --metric val_loss --mode min --param lr=loguniform:1e-4:1 "
                   "--param opt=choice:adam,sgd --gpus 1 --seed 3 --as sw\n" + CELL)
    assert r.success, r.error_in_exec
    body, = fake_client.created
    assert body["trials"] == 6 and body["parallel"] == 2 and body["gpus"] == 1 and body["seed"] == 3
    assert body["space"] == {"lr": {"type": "loguniform", "low": 1e-4, "high": 1.0},
                             "opt": {"type": "choice", "values": ["adam", "sgd"]}}
    assert "def helper" in body["script"] and body["script"].rstrip().endswith(CELL.rstrip())
    assert body["name"] == f"notebook-sweep-{r.execution_count}"  # the cell's own number
    captured = capsys.readouterr()
    out = captured.out
    assert "started sweep s-000001: 6 trials, 2 at a time, minimising val_loss" in out
    # what the capture carried is information for a %%sweep cell, named so, not an error
    assert "%%sweep sent from earlier cells: helper" in out and "%%train" not in out + captured.err
    sw = shell.user_ns["sw"]
    assert isinstance(sw, SweepHandle) and sw.status == "completed"
    best = sw.best_trial
    assert (best.value, best.params, best.job_id, best.outputs_path) == (0.2, {"lr": 0.02, "opt": "adam"}, "j-000003",
                                                                          "/jobs/j-000003/outputs")
    assert [row["number"] for row in sw.trials] == [0, 1, 2]
    assert sw.register_best("regressor", stage="staging") == {"name": "regressor", "version": 1, "job": "j-000003"}
    name, job, kw = fake_client.registered[0]
    assert (name, job, kw["stage"]) == ("regressor", "j-000003", "staging") and "best trial 2 of sweep s-000001" in kw["description"]
    sw.cancel()
    assert fake_client.cancelled == ["s-000001"]


def test_space_from_a_dict_in_the_cell(shell, sweep_magics, fake_client):
    r = run(shell, "%%sweep --trials 2 --metric acc --mode max --wait\nimport trainhub\n"
                   "search_space = {'units': 'int:16:64:16', 'act': ['relu', 'gelu']}\n"
                   "trainhub.report(acc=trainhub.params()['units'] / 64)\n")
    assert r.success, r.error_in_exec
    assert fake_client.created[0]["space"] == {"units": {"type": "int", "low": 16, "high": 64, "step": 16},
                                               "act": {"type": "choice", "values": ["relu", "gelu"]}}


@pytest.mark.parametrize("line, cell, message", [
    ("--trials 4 --metric val_loss --param lr=uniform:0:1", CELL,
     "--mode is required: min or max (does a smaller or a larger val_loss win?); nothing was submitted."),
    ("--trials 4 --metric val_loss --mode best --param lr=uniform:0:1", CELL, "--mode must be min or max, not 'best'"),
    ("--metric val_loss --mode min --param lr=uniform:0:1", CELL, "--trials N is required"),
    ("--trials 4 --mode min --param lr=uniform:0:1", CELL, "--metric NAME is required"),
    ("--trials 4 --metric val_loss --mode min --param lr=gauss:0:1", CELL,
     "--param lr=gauss:0:1: unknown distribution 'gauss'; use one of uniform, loguniform, int, logint, choice"),
    ("--trials 4 --metric val_loss --mode min --param lr=uniform:1:0", CELL,
     "--param lr=uniform:1:0: empty range: LOW (1) must be less than HIGH (0); nothing was submitted."),
    ("--trials 4 --metric val_loss --mode min", CELL, "the search space is empty"),
    ("--trials 4 --metric val_loss --mode min --param lr=uniform:0:1", "import trainhub\ntrainhub.report(loss=1)\n",
     "the cell never reports 'val_loss': call trainhub.report(step=..., val_loss=...)"),
    ("--trials 4 --metric val_loss --mode min --param lr=uniform:0:1", "search_space = {'lr': 'uniform:0:2'}\n" + CELL,
     "parameter(s) lr declared both with --param and in the cell's search_space dict"),
    ("--trials 0 --metric val_loss --mode min", CELL, "argument --trials: must be >= 1, got 0"),
    ("--trials 4 --metric m --mode min --sampler anneal", CELL, "argument --sampler: invalid choice: 'anneal'"),
    ("--trials 4 --metric val_loss --mode min --param lr=uniform:0:1 --as 9x", CELL, "not a Python variable name"),
    ("--trials 4 --metric val_loss --mode min --param lr=uniform:0:1", "for x in\n", "syntax error in line 2 of the cell"),
])
def test_bad_input_is_a_usage_error_and_submits_nothing(shell, sweep_magics, fake_client, capsys, line, cell, message):
    run(shell, "def helper(lr):\n    return lr\n")
    r = run(shell, f"%%sweep {line}\n{cell}")
    err = capsys.readouterr().err
    assert isinstance(r.error_in_exec, UsageError), r.error_in_exec
    assert message in err, err
    assert "Traceback" not in err
    assert fake_client.created == []


def test_no_metric_check_lets_a_helper_report(shell, sweep_magics, fake_client):
    r = run(shell, "%%sweep --trials 2 --metric val_loss --mode min --param lr=uniform:0:1 --no-metric-check\n"
                   "import mylib\nmylib.train()\n")
    assert r.success and fake_client.created[0]["check_metric"] is False


def test_dry_run_prints_and_submits_nothing(shell, sweep_magics, fake_client, capsys):
    r = run(shell, "%%sweep --trials 2 --metric val_loss --mode min --param lr=uniform:0:1 --dry-run\n"
                   "import trainhub\ntrainhub.report(val_loss=1)\n")
    assert r.success and fake_client.created == []
    out = capsys.readouterr().out
    assert '"trials": 2' in out and "trainhub.report(val_loss=1)" in out


def test_the_notebooks_folder_is_sent_once_and_named_in_the_sweep(shell, sweep_magics, fake_client, capsys):
    """%%sweep, like %%train, sends the notebook's folder (its modules, its ignore files respected): once, its hash
    in the sweep's body (each trial runs in its own copy); the trial script puts the copy first on sys.path."""
    import os
    from pathlib import Path

    folder = Path(os.getcwd())
    (folder / "datautils.py").write_text("def objective(lr):\n    return lr\n")
    (folder / "notes.log").write_text("noise\n")
    (folder / ".trainhubignore").write_text("*.log\n")
    r = run(shell, "%%sweep --trials 3 --parallel 3 --metric val_loss --mode min --param lr=uniform:0:1 --exclude big/\n"
                   "import trainhub\nfrom datautils import objective\n"
                   "trainhub.report(val_loss=objective(trainhub.params()['lr']))\n")
    assert r.success, r.error_in_exec
    (sent_folder, exclude, names), = fake_client.workdirs  # sent once for the whole sweep
    assert sent_folder == str(folder) and exclude == ("big/",)
    assert [n for n in names if n != "."] == [".trainhubignore", "datautils.py"]
    body, = fake_client.created
    assert len(body["workdir"]) == 64 and int(body["workdir"], 16) >= 0
    assert "sys.path.insert(0, _th_os.getcwd())" in body["script"]
    out = capsys.readouterr().out
    assert f"%%sweep sent the working directory {folder} (each trial runs in a copy): 2 files" in out


def test_no_workdir_and_another_folder(shell, sweep_magics, fake_client, tmp_path, capsys):
    flags = "%%sweep --trials 2 --metric val_loss --mode min --param lr=uniform:0:1"
    assert run(shell, f"{flags} --no-workdir\n{CELL}".replace("helper(", "float(")).success
    assert fake_client.workdirs == [] and "workdir" not in fake_client.created[-1]
    assert "sys.path.insert(0, _th_os.getcwd())" not in fake_client.created[-1]["script"]
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "helpers.py").write_text("X = 7\n")
    assert run(shell, f"{flags} --workdir {other}\n{CELL}".replace("helper(", "float(")).success
    assert [w[0] for w in fake_client.workdirs] == [str(other)] and len(fake_client.created[-1]["workdir"]) == 64
    # --dry-run says what it would send, and sends nothing
    assert run(shell, f"{flags} --dry-run\n{CELL}".replace("helper(", "float(")).success
    assert len(fake_client.workdirs) == 1 and len(fake_client.created) == 2
    assert "%%sweep would send the working directory" in capsys.readouterr().out


def test_sweep_help_names_the_workdir_flags(shell, sweep_magics, capsys):
    from trainhub.kernels.sweep import sweep_parser

    text = sweep_parser().format_help()
    assert "--workdir DIR" in text and "--no-workdir" in text and "--exclude PATTERN" in text
    assert "every trial runs in its own copy" in text


# -- rendering -----------------------------------------------------------------------------------------
def test_renderers():
    assert sweep_progress(DONE) == "3/3 trials done, 2 complete, 1 pruned, 0 running"
    head = render_header(DONE)
    assert "s-000001" in head and "completed" in head and "val_loss = 0.2" in head and "j-000003" in head
    assert "file:///data/alice/jobs/j-000003" in head
    table = render_trials_table(TRIALS)
    assert table.count("<tr>") == 4 and "pruned" in table and "adam" in table
    assert trial_rows(TRIALS)[1] == {"number": 1, "state": "pruned", "value": 2.0, "lr": 0.5, "opt": "sgd", "steps": 1,
                                     "job_id": "j-000002", "reason": "pruned at step 0"}
    hist = svg_history(TRIALS, "min")
    assert hist.startswith("<svg") and hist.count("<circle") == 2 and "best 0.2" in hist
    inter = svg_intermediate(TRIALS)
    assert inter.count("<polyline") == 2 and inter.count("<circle") == 1 and "#bc4c00" in inter  # pruned: orange
    imp = svg_importance({"lr": 0.8, "opt": 0.2})
    assert imp.index(">lr<") < imp.index(">opt<") and "0.80" in imp
    plots = render_plots(DONE, TRIALS)
    assert plots.count("<svg") == 3
    assert render_plots({**DONE, "importance": None}, []) == "" and svg_history([], "min") == ""
    assert render_trials_table([]) == "<div style='color:#57606a'>(no trials yet)</div>"
    assert summary_line(DONE).startswith("sweep s-000001 completed: 3/3 trials done") and "best val_loss = 0.2" in summary_line(DONE)


def test_panel_updates_from_api_answers(fake_client):
    pytest.importorskip("ipywidgets")
    from trainhub.kernels.sweep import SweepPanel

    panel = SweepPanel(fake_client, SWEEP, poll=0.01)
    assert panel.bar.max == 3 and panel.bar.value == 0 and not panel.cancel_button.disabled
    panel.start()
    assert panel.done.wait(5)
    assert panel.bar.value == 3 and panel.bar.bar_style == "success" and panel.cancel_button.disabled
    assert "val_loss = 0.2" in panel.header.value and panel.plots.value.count("<svg") == 3


# -- Optuna: the dashboard link and the study --------------------------------------------------------------
@pytest.mark.parametrize("prefix, sweep_id, expected", [
    ("/user/alice/", "s-000001", {"jobs_table": "/user/alice/lab?trainhub-sweep=s-000001",
                                  "optuna_dashboard": "/user/alice/trainhub/optuna/open?sweep=s-000001"}),
    ("/user/bob", "s-000042", {"jobs_table": "/user/bob/lab?trainhub-sweep=s-000042",
                               "optuna_dashboard": "/user/bob/trainhub/optuna/open?sweep=s-000042"}),
    ("/user/carol/", "s 1&x=2", {"jobs_table": "/user/carol/lab?trainhub-sweep=s%201%26x%3D2",
                                 "optuna_dashboard": "/user/carol/trainhub/optuna/open?sweep=s%201%26x%3D2"}),
    ("", "s-000001", {}),  # outside a server: no links
])
def test_sweep_links(prefix, sweep_id, expected):
    from trainhub.kernels.sweep import render_dashboard_link, sweep_links

    assert sweep_links({"id": sweep_id}, prefix) == expected
    link = render_dashboard_link({"id": sweep_id}, prefix)
    if expected:
        assert f"href='{expected['optuna_dashboard'].replace('&', '&amp;')}'" in link and ">Open in Optuna dashboard<" in link
    else:
        assert link == ""


def test_the_server_prefix_comes_from_the_environment(monkeypatch):
    from trainhub.kernels.sweep import sweep_links, sweep_static_bundle

    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/dora/")
    assert sweep_links(SWEEP)["optuna_dashboard"] == "/user/dora/trainhub/optuna/open?sweep=s-000001"
    bundle = sweep_static_bundle(DONE, TRIALS)
    assert bundle["application/vnd.trainhub.sweep+json"]["links"]["optuna_dashboard"] == \
        "/user/dora/trainhub/optuna/open?sweep=s-000001"
    assert "href='/user/dora/trainhub/optuna/open?sweep=s-000001'" in bundle["text/html"]
    assert "in Optuna's dashboard: /user/dora/trainhub/optuna/open?sweep=s-000001" in bundle["text/plain"]
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX")
    assert sweep_links(SWEEP) == {}


def test_study_opens_the_users_copy_and_says_when_it_is_not_there_yet(fake_client, tmp_path, monkeypatch):
    """``SweepHandle.study()``: optuna.load_study on the user's copy (trainhub.optuna_storage(), or the storage given),
    the study named by the sweep's id; a sweep not in the copy yet is a RuntimeError saying when it will be."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path}/studies.db"
    study = optuna.create_study(study_name="s-000001", storage=storage, direction="minimize")
    study.add_trial(optuna.trial.create_trial(params={"lr": 0.02}, distributions={
        "lr": optuna.distributions.FloatDistribution(1e-4, 1.0, log=True)}, value=0.2))
    sw = SweepHandle(fake_client, SWEEP)
    got = sw.study(storage)
    assert got.study_name == "s-000001" and got.best_value == 0.2 and got.best_params == {"lr": 0.02}
    monkeypatch.setenv("HOME", str(tmp_path))  # trainhub.optuna_storage(): the copy in the user's home
    from trainhub.runtime import optuna_storage

    assert optuna_storage().startswith("sqlite:///") and str(tmp_path) in optuna_storage()
    with pytest.raises(RuntimeError, match="sweep s-000001 is not in your Optuna copy .* yet: it is written when its "
                                           "first trial finishes"):
        sw.study()
    other = SweepHandle(fake_client, {**SWEEP, "id": "s-000002"})
    with pytest.raises(RuntimeError, match="sweep s-000002 is not in your Optuna copy"):
        other.study(storage)
