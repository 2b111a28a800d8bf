"""CONTRACT tests of `trainhub jobs ...` against the in-process jobs stand-in (see conftest)."""

from __future__ import annotations

import json

import pytest

from trainhub.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_submit_script_wait_show_logs_metrics(api_env, capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import trainhub\nprint('epoch done')\ntrainhub.log_metrics(step=1, loss=0.25, acc=0.5)\n")
    code, out, err = run(capsys, "jobs", "submit", str(script), "--gpus", "1", "--env", "A=1", "--time-limit", "30m", "--wait")
    assert code == 0, err
    job_id = out.split()[1]
    job = api_env.service.jobs[job_id]
    assert job["state"] == "succeeded" and job["name"] == "train" and job["env"] == {"A": "1"}
    assert job["time_limit"] == "30m" and "epoch done" in job["script"]
    assert f"{job_id} succeeded" in err

    code, out, _ = run(capsys, "jobs", "show", job_id)
    assert code == 0 and "state:    succeeded" in out and "1 GPU x 1 worker" in out
    code, out, _ = run(capsys, "jobs", "show", job_id, "--json")
    assert json.loads(out)["id"] == job_id
    code, out, _ = run(capsys, "jobs", "logs", job_id)
    assert out.strip().endswith("[0] epoch done")
    code, out, _ = run(capsys, "jobs", "logs", job_id, "--follow")
    assert out.strip().endswith("[0] epoch done")
    code, out, _ = run(capsys, "jobs", "metrics", job_id)
    assert out.splitlines()[0].split() == ["STEP", "WORKER", "loss", "acc"]
    assert out.splitlines()[1].split() == ["1", "0", "0.25", "0.5"]
    code, out, _ = run(capsys, "jobs", "metrics", job_id, "--json")
    assert json.loads(out)["metrics"][0]["values"] == {"loss": 0.25, "acc": 0.5}


def test_failed_job_exits_nonzero_with_log_tail(api_env, capsys):
    code, out, err = run(capsys, "jobs", "submit", "--command", "echo boom; exit 3", "--wait")
    assert code == 1
    assert "failed" in err and "exited with code 3" in err and "boom" in err


def test_list_and_cancel(api_env, capsys):
    code, out, _ = run(capsys, "jobs", "list")
    assert code == 0 and out.strip() == "no jobs"
    run(capsys, "jobs", "submit", "--command", "sleep 30", "--name", "sleepy")
    code, out, _ = run(capsys, "jobs", "list", "--state", "running")
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["ID", "NAME", "USER", "STATE"] and "sleepy" in lines[1] and "running" in lines[1]
    job_id = lines[1].split()[0]
    code, out, _ = run(capsys, "jobs", "cancel", job_id)
    assert code == 0 and out.startswith(f"{job_id}: cancelled")
    code, out, _ = run(capsys, "jobs", "list", "--all", "--json")
    assert json.loads(out)["items"][0]["state"] == "cancelled"
    code, _, err = run(capsys, "jobs", "list", "--state", "sleeping")
    assert code == 2 and "unknown state sleeping" in err


def test_list_marks_a_cut_reason_and_show_gives_it_whole(api_env, capsys):
    """A reason too long for the table ends in "…" (never a half reason that reads as whole); show has it all."""
    run(capsys, "jobs", "submit", "--command", "sleep 30", "--name", "a-name-longer-than-the-name-column")
    (job,) = api_env.service.jobs.values()
    job["reason"] = reason = "waiting for 2 GPUs (0 free of 8: 6 held by other users' jobs, 2 by your notebook server)"
    code, out, _ = run(capsys, "jobs", "list")
    row = out.splitlines()[1]
    assert code == 0 and row.endswith("…") and reason[:40] in row and reason not in row
    assert "a-name-longer-than-the-…" in row
    code, out, _ = run(capsys, "jobs", "show", job["id"])
    assert code == 0 and reason in out


@pytest.mark.parametrize("argv, words", [
    (["jobs", "submit", "--gpus", "3", "--workers", "2", "--command", "true"], ["6 GPUs", "quota is 4", "403"]),
    (["jobs", "submit", "--profile", "nope", "--command", "true"], ["profile", "nope", "400"]),
    (["jobs", "show", "j-424242"], ["no job j-424242", "404"]),
])
def test_api_errors_are_one_line(api_env, capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 1 and err.count("\n") == 1 and err.startswith("trainhub jobs: error: ")
    assert all(w in err for w in words), err


def test_usage_errors(api_env, capsys, tmp_path):
    (tmp_path / "x.sh").write_text("echo")
    code, _, err = run(capsys, "jobs", "submit", str(tmp_path / "x.sh"))
    assert code == 2 and "not a .py file" in err and "--command" in err
    code, _, err = run(capsys, "jobs", "submit")
    assert code == 2 and "either SCRIPT" in err
    for bad in (["--env", "NOEQUALS"], ["--gpus", "-1"], ["--time-limit", "soon"], ["--bogus"]):
        with pytest.raises(SystemExit) as e:
            main(["jobs", "submit", "--command", "true", *bad])
        assert e.value.code == 2
    assert api_env.service.posts == 0


def test_url_and_token_flags_override_env(jobs_api, capsys, monkeypatch):
    monkeypatch.delenv("TRAINHUB_API_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    code, _, err = run(capsys, "jobs", "list")
    assert code == 2 and "not in a trainhub notebook/terminal: pass --url/--token" in err
    code, out, _ = run(capsys, "jobs", "list", "--url", jobs_api.url, "--token", jobs_api.token, "--all")
    assert code == 0 and "no jobs" in out


def test_help_on_every_command(capsys):
    for cmd in ("submit", "list", "show", "logs", "cancel", "metrics"):
        with pytest.raises(SystemExit) as e:
            main(["jobs", cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert "--url" in out and "--token" in out


# -- a folder and a command with arguments (issue 34) ----------------------------------------------------------------
@pytest.fixture
def project(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "datautils.py").write_text("def load(n):\n    return list(range(n))\n")
    (folder / "train.py").write_text("import sys\nfrom datautils import load\nprint('args', sys.argv[1:], 'data', load(3))\n")
    (folder / ".gitignore").write_text("runs/\n")
    (folder / "runs").mkdir()
    (folder / "runs" / "old.txt").write_text("x")
    return folder


@pytest.mark.parametrize("argv, command", [
    (["--", "python", "train.py", "--epochs", "3"], "python train.py --epochs 3"),
    (["train.py", "--", "--epochs", "3"], "python train.py --epochs 3"),  # a first word ending in .py runs with python
    (["--command", "python train.py --epochs 3"], "python train.py --epochs 3"),
])
def test_submit_a_folder_and_a_command_with_arguments(api_env, capsys, project, argv, command):
    code, out, err = run(capsys, "jobs", "submit", "--workdir", str(project), "--wait", "--json", *argv)
    assert code == 0, err
    job = json.loads(out)
    assert job["command"] == command
    if "--command" not in argv:
        assert job["name"] == "train"  # named after its script
    logs = api_env.service.log_lines(job["id"])
    assert any("args ['--epochs', '3'] data [0, 1, 2]" in ln for ln in logs), logs
    assert f"working directory {project}: 3 files" in err  # runs/ left out by its .gitignore
    assert api_env.service.workdir_puts == 1


def test_a_folder_too_big_to_send_is_a_usage_error_naming_it(api_env, capsys, project):
    with open(project / "weights.bin", "wb") as f:
        f.truncate(51 << 20)  # sparse
    code, _, err = run(capsys, "jobs", "submit", "--workdir", str(project), "--", "python", "train.py")
    assert code == 2 and "is too big" in err and "weights.bin" in err and "--exclude" in err
    assert api_env.service.posts == 0
    code, _, err = run(capsys, "jobs", "submit", "--workdir", str(project), "--exclude", "*.bin", "--", "python", "train.py")
    assert code == 0, err


def test_exclude_without_a_workdir_is_a_usage_error(api_env, capsys):
    code, _, err = run(capsys, "jobs", "submit", "--exclude", "data/", "--", "python", "train.py")
    assert code == 2 and "give --workdir DIR too" in err and api_env.service.posts == 0


def test_without_a_workdir_a_command_with_arguments_runs_as_before(api_env, capsys):
    code, out, err = run(capsys, "jobs", "submit", "--json", "--", "bash", "-c", "echo hi $0", "there")
    assert code == 0, err
    assert json.loads(out)["command"] == "bash -c 'echo hi $0' there"
    assert api_env.service.workdir_puts == 0
