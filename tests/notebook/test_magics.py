"""%%train and %train in a real in-process IPython shell.

Submissions go to the jobs-API contract stand-in (tests/jobs_contract_server.py), where the
generated scripts really run as subprocesses; ``service.posts`` counts what reached the API.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from trainhub.kernels.handle import JobFailedError, JobHandle, Table


def run(shell, source):
    return shell.run_cell(source, store_history=True)


def test_unknown_flag_prints_usage_and_submits_nothing(shell, api_magics, jobs_api, capsys):
    result = run(shell, "%%train --gpu 1\nprint('hi')\n")
    err = capsys.readouterr().err
    assert isinstance(result.error_in_exec, UsageError)
    assert "UsageError: unrecognized arguments: --gpu 1" in err
    assert "usage: %%train" in err and "--gpus N" in err and "--workers W" in err and "--as VAR" in err
    assert "Traceback" not in err and "SystemExit" not in err
    assert jobs_api.service.posts == 0


@pytest.mark.parametrize("line, words", [
    ("--gpus two", ["--gpus", "whole number"]),
    ("--env NOVALUE", ["--env", "NAME=VALUE"]),
    ("--as 1x", ["not a Python variable name"]),
    ("--name 'unclosed", ["cannot parse"]),
])
def test_bad_values_are_usage_errors(shell, api_magics, jobs_api, capsys, line, words):
    result = run(shell, f"%%train {line}\nprint('hi')\n")
    err = capsys.readouterr().err
    assert isinstance(result.error_in_exec, UsageError)
    assert all(w in err for w in words), err
    assert jobs_api.service.posts == 0


def test_help_is_not_an_error(shell, magics, capsys):
    result = run(shell, "%%train --help\npass\n")
    assert result.success and "--time-limit T" in capsys.readouterr().out
    result = run(shell, "%train help")
    out = capsys.readouterr().out
    assert result.success and "%train list" in out and "--gpus N" in out


@pytest.mark.parametrize("cell", ["%%train --help", "%%train -h", "%%train --gpus 2 --help\n", "%%train --help\n\n",
                                  "%%sweep --help", "%%sweep -h"])
def test_help_prints_the_usage_whatever_the_body(shell, api_magics, jobs_api, capsys, cell):
    """Issue 34: a lone `%%train --help` line failed with IPython's "cell body is empty"."""
    result = run(shell, cell)
    out, err = capsys.readouterr()
    assert result.success, (result.error_before_exec, result.error_in_exec, err)
    magic = cell.split()[0]
    assert f"usage: {magic}" in out and "--gpus N" in out and "body is empty" not in err
    assert jobs_api.service.posts == 0


def test_an_empty_cell_without_help_is_still_refused(shell, magics, capsys):
    result = run(shell, "%%train --gpus 1")
    assert isinstance(result.error_in_exec or result.error_before_exec, UsageError)
    assert "usage:" not in capsys.readouterr().out


def test_cell_with_notebook_context_runs_as_a_job(shell, api_magics, jobs_api, capsys):
    assert run(shell, "import json\ndef helper(n):\n    return f'helper says {n}'\nSTEPS = 3\n").success
    assert run(shell, "%load_ext trainhub.kernels").success
    assert run(shell, "settings = dict(lr=0.5)").success  # not a literal: sent as a pickled value
    cell = ("%%train --wait --as job --name ctx --env MODE=test\n"
            "import os, trainhub\n"
            "print(helper(settings['lr']), os.environ['MODE'])\n"
            "for s in range(STEPS):\n"
            "    trainhub.log_metrics(step=s, loss=1 / (s + 1))\n"
            "(trainhub.outputs_dir() / 'out.json').write_text(json.dumps(settings))\n")
    result = run(shell, cell)
    out, err = capsys.readouterr()
    assert result.success, (result.error_in_exec, out, err)
    job = shell.user_ns["job"]
    assert isinstance(job, JobHandle) and result.result is job and shell.user_ns["_"] is job
    assert job.status == "succeeded"
    assert "helper says 0.5 test" in job.logs()
    table = job.metrics()
    assert table.column("loss") == [1.0, 0.5, pytest.approx(1 / 3)] and table.column("step") == [0, 1, 2]
    assert "<table>" in table._repr_html_()
    assert (jobs_api.service.root / job.id / "outputs" / "out.json").read_text() == '{"lr": 0.5}'
    spec = jobs_api.service.jobs[job.id]
    assert spec["name"] == "ctx" and spec["env"] == {"MODE": "test"}
    # what was carried is information (stdout), not an error
    assert "%%train sent from earlier cells: STEPS, helper, json; values: settings" in out and "sent" not in err
    assert jobs_api.service.posts == 1


def test_failing_job_fails_the_cell_with_reason(shell, api_magics, jobs_api, capsys):
    result = run(shell, "%%train --wait\nprint('about to fail')\nraise SystemExit(4)\n")
    assert isinstance(result.error_in_exec, JobFailedError)
    msg = str(result.error_in_exec)
    assert "failed" in msg and "exited with code 4" in msg and "about to fail" in msg


def test_api_refusal_shows_the_server_message_once(shell, api_magics, jobs_api, capsys):
    result = run(shell, "%%train --gpus 3 --workers 2\nprint(1)\n")
    err = capsys.readouterr().err
    assert isinstance(result.error_in_exec, UsageError)
    assert "the job was not submitted: the job needs 6 GPUs but your quota is 4 GPUs (HTTP 403)" in err
    result = run(shell, "%%train --profile gpu-9\nprint(1)\n")
    assert "unknown profile 'gpu-9'" in capsys.readouterr().err
    assert jobs_api.service.posts == 2 and not jobs_api.service.jobs


def test_big_values_are_refused_by_name(shell, api_magics, jobs_api, capsys):
    api_magics.max_value_bytes = 1000
    run(shell, "data = list(range(10000))\nimport threading\nlock = threading.Lock()\n")
    result = run(shell, "%%train\nprint(len(data), lock)\n")
    err = capsys.readouterr().err
    assert isinstance(result.error_in_exec, UsageError)
    assert "- data: " in err and "over the 1.0 KB limit" in err and "- lock: cannot be pickled" in err
    assert "TRAINHUB_STORAGE_URL" in err and jobs_api.service.posts == 0
    result = run(shell, "%%train --ignore-missing\nprint('no data needed after all')\n")
    assert result.success and jobs_api.service.posts == 1


def test_syntax_error_reports_the_line_and_submits_nothing(shell, api_magics, jobs_api, capsys):
    result = run(shell, "%%train\nx = 1\nif x\n    print(x)\n")
    err = capsys.readouterr().err
    assert isinstance(result.error_in_exec, UsageError)
    assert "syntax error in line 3 of the cell" in err and "if x" in err and jobs_api.service.posts == 0


def test_dry_run_prints_the_script(shell, magics, capsys):
    run(shell, "def helper():\n    return 1\n")
    result = run(shell, "%%train --dry-run\nprint(helper())\n")
    out = capsys.readouterr().out
    assert result.success and "def helper():" in out and out.index("def helper") < out.index("print(helper())")


def test_not_configured(shell, magics, monkeypatch, capsys):
    monkeypatch.delenv("TRAINHUB_API_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    result = run(shell, "%%train\nprint(1)\n")
    err = capsys.readouterr().err
    assert isinstance(result.error_in_exec, UsageError)
    assert "not in a trainhub notebook/terminal" in err and "TrainMagics.api_url" in err


def test_line_magics(shell, api_magics, jobs_api, capsys):
    run(shell, "%%train --name sleeper\nimport time\nprint('sleeping', flush=True)\ntime.sleep(30)\n")
    job_id = next(iter(jobs_api.service.jobs))
    capsys.readouterr()
    table = shell.run_line_magic("train", "list --state running")
    assert isinstance(table, Table) and table.column("id") == [job_id] and table.column("name") == ["sleeper"]
    shell.run_line_magic("train", f"status {job_id}")
    assert "state:    running" in capsys.readouterr().out
    shell.run_line_magic("train", f"cancel {job_id}")
    assert f"{job_id}: cancelled" in capsys.readouterr().out
    shell.run_line_magic("train", f"logs {job_id} --tail 5")
    shell.run_line_magic("train", f"logs {job_id} --follow")
    with pytest.raises(UsageError, match="no job j-999999"):
        shell.run_line_magic("train", "status j-999999")
    with pytest.raises(UsageError, match="invalid choice"):
        shell.run_line_magic("train", "stop j-1")
    assert shell.run_line_magic("train", "list --state failed") is None
    assert "no jobs" in capsys.readouterr().out


def test_widget_mode_displays_a_live_panel(shell, api_magics, jobs_api, monkeypatch, capsys):
    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(type(api_magics), "_widgets", lambda self: True)
    result = run(shell, "%%train --wait --as j\nimport trainhub\ntrainhub.log_metrics(step=1, loss=0.5)\nprint('done')\n")
    assert result.success, result.error_in_exec
    panel = shell.user_ns["j"].panel
    assert panel.done.is_set() and "succeeded" in panel.header.value
    assert "done" in panel.logs.value and "<polyline" in panel.chart.value and panel.cancel_button.disabled


def test_the_value_under_the_cell_is_never_a_stale_snapshot(shell, api_magics, jobs_api, monkeypatch, capsys):
    """Under the cell that made it the handle shows nothing (the live panel is there); in a later cell the
    live panel again; a default job name carries the cell's own number ([N] -> notebook-cell-N)."""
    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(type(api_magics), "_widgets", lambda self: True)
    result = run(shell, "%%train --as j\nprint('done')\n")
    assert result.success, result.error_in_exec
    handle = shell.user_ns["j"]
    assert jobs_api.service.jobs[handle.id]["name"] == f"notebook-cell-{result.execution_count}"
    assert handle.shown_in_cell == result.execution_count
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **kw: shown.append(a))
    shell.displayhook.exec_result = result  # displayed under its own cell: nothing
    handle._ipython_display_()
    assert shown == []
    later = run(shell, "1")
    shell.displayhook.exec_result = later  # typed in a later cell: the live panel again, not text
    handle._ipython_display_()
    assert shown == [(handle.panel,)]
    handle.panel.stop()
    handle.panel = None  # without a panel: the state as of now (asks the API), saying when
    handle.wait()
    shown.clear()
    handle._ipython_display_()
    (bundle,) = shown[0][:1]
    assert "succeeded (as of " in bundle["text/plain"] and "when last seen" not in bundle["text/plain"]


def test_state_text_never_repeats_the_state():
    from trainhub.fmt import state_text

    assert state_text({"state": "queued", "reason": "queued"}) == "queued"
    assert state_text({"state": "queued", "reason": ""}) == "queued"
    assert state_text({"state": "queued", "reason": "waiting for 2 GPUs: 0 of 4 free"}) == \
        "queued (waiting for 2 GPUs: 0 of 4 free)"


def test_startup_file_loads_the_extension_only_on_the_platform(tmp_path):
    import os
    import subprocess
    import sys

    from trainhub.kernels.startup import install_ipython_startup

    path = install_ipython_startup(tmp_path)
    assert path == tmp_path / ".ipython" / "profile_default" / "startup" / "00-trainhub.py"
    mtime = path.stat().st_mtime_ns
    assert install_ipython_startup(tmp_path) == path and path.stat().st_mtime_ns == mtime  # idempotent
    code = "import sys; print('train' in get_ipython().magics_manager.magics['cell'], sorted(k for k in globals() if 'trainhub' in k))"
    for url, expected in (("http://hub/services/trainhub/api", "True []"), ("", "False []")):
        env = dict(os.environ, IPYTHONDIR=str(tmp_path / ".ipython"), TRAINHUB_API_URL=url)
        r = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "-c", code],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.stdout.strip() == expected, r.stderr


def test_the_charts_kernel_config_loads_train_in_a_real_kernel_only_on_the_platform(tmp_path):
    """Kubernetes notebook pods get helm/trainhub/files/ipython_kernel_config.py as IPython's kernel config
    (GPUKubeSpawner.kernel_config_map): a real ipykernel reading it has %%train exactly when $TRAINHUB_API_URL is
    set. (Here from the profile folder, which IPython reads like /etc/ipython, where the pod has it.)"""
    import os
    import shutil
    from pathlib import Path

    from jupyter_client.manager import start_new_kernel

    chart_file = Path(__file__).parents[2] / "helm" / "trainhub" / "files" / "ipython_kernel_config.py"
    profile = tmp_path / ".ipython" / "profile_default"
    profile.mkdir(parents=True)
    shutil.copy(chart_file, profile / "ipython_kernel_config.py")
    for url, expected in (("http://trainhub-jobs.ns.svc:8080/services/trainhub/api", True), ("", False)):
        env = dict(os.environ, IPYTHONDIR=str(tmp_path / ".ipython"), TRAINHUB_API_URL=url)
        km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
        try:
            out = []
            kc.execute_interactive("print('train' in get_ipython().magics_manager.magics['cell'])", timeout=60,
                                   output_hook=lambda msg: out.append(msg["content"].get("text", "")))
            assert "".join(out).strip() == str(expected), out
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_without_gpus_a_cell_runs_on_this_servers_profile(shell, api_magics, jobs_api, monkeypatch, capsys):
    """docs/notebooks.md: `--gpus N` (per worker; default: this server's profile's). Issue 34: on a 2-GPU server
    %%train got 0 GPUs."""
    monkeypatch.setenv("TRAINHUB_PROFILE", "gpu-2")
    result = run(shell, "%%train --as j\nprint('on the server profile')\n")
    assert result.success, result.error_in_exec
    job = jobs_api.service.jobs[shell.user_ns["j"].id]
    assert job["profile"] == "gpu-2" and job["gpus"] == 2
    assert f"{job['id']}: 2 GPUs per worker, as this server's profile gpu-2 (--gpus N to choose)" in capsys.readouterr().out
    for flags, profile, gpus in [("--gpus 0", None, 0), ("--gpus 1", None, 1), ("--profile gpu-1", "gpu-1", 1)]:
        result = run(shell, f"%%train --as j {flags}\nprint('chosen')\n")
        assert result.success, result.error_in_exec
        job = jobs_api.service.jobs[shell.user_ns["j"].id]
        assert (job["profile"], job["gpus"]) == (profile, gpus), flags
        assert "this server's profile" not in capsys.readouterr().out
    monkeypatch.delenv("TRAINHUB_PROFILE")  # outside a platform server: the service's default (0)
    assert run(shell, "%%train --as j\nprint('anywhere')\n").success
    job = jobs_api.service.jobs[shell.user_ns["j"].id]
    assert (job["profile"], job["gpus"]) == (None, 0)


def test_a_refusal_of_the_servers_profile_says_how_to_choose(shell, api_magics, jobs_api, monkeypatch, capsys):
    monkeypatch.setenv("TRAINHUB_PROFILE", "gpu-2")
    jobs_api.service.quota_gpus = 1
    try:
        result = run(shell, "%%train\nprint('too big')\n")
    finally:
        jobs_api.service.quota_gpus = 4
    assert isinstance(result.error_in_exec, UsageError)
    message = str(result.error_in_exec)
    assert message.startswith("the job was not submitted: ") and \
        "(without --gpus as this server's profile gpu-2; pass --gpus N, e.g. --gpus 0, to choose)" in message
    assert jobs_api.service.jobs == {}
