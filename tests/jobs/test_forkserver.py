"""The warm fork server of the local launcher (services/jobs/forkserver.py), without a platform.

Each test talks to a real fork server process on a socket under ``tmp_path``; workers are
real processes (their own sessions), checked through the files the launcher reads: the
timestamped log and the exit file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from waiting import await_for, wait_for

from trainhub.services.jobs import forkserver
from trainhub.services.jobs.forkserver import ForkServer, ForkServerError, server_environment
from trainhub.services.jobs.launcher import JobView
from trainhub.services.jobs.local import LocalLauncher

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[(\d+)\] (.*)$")


def base_env(**extra) -> dict:
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8"), "PYTHONUNBUFFERED": "1"}
    env.update(extra)
    return env


@pytest.fixture
def server(tmp_path):
    fs = ForkServer(str(tmp_path / ".forkserver.sock"), str(tmp_path / "forkserver.log"), server_environment(os.environ))
    fs.start()
    yield fs
    fs.stop()


class Run:
    """One worker forked through the server: its script, log and exit file."""

    def __init__(self, fs: ForkServer, tmp: Path, source: str, rank: int = 0, env: dict | None = None, cwd: str | None = None,
                 name: str = "w"):
        self.script = tmp / f"{name}-{rank}.py"
        self.script.write_text(source)
        self.log, self.exit_file = tmp / f"{name}-{rank}.log", tmp / f"{name}-{rank}.exit"
        self.pid = fs.spawn({"script": str(self.script), "args": [], "env": env if env is not None else base_env(RANK=str(rank)),
                             "cwd": cwd or str(tmp), "log": str(self.log), "exit_file": str(self.exit_file), "rank": rank,
                             "wrapper_err": str(tmp / f"{name}-{rank}.wrapper.err")})

    def wait(self, timeout: float = 20) -> int:
        wait_for(self.exit_file.exists, what=f"the exit file of {self.script.name} (log: {self.text()!r})",
                 timeout=timeout, interval=0.01)
        return int(self.exit_file.read_text())

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def lines(self) -> list[tuple[int, str]]:
        out = []
        for line in self.text().splitlines():
            m = LINE.match(line)
            assert m, f"not a timestamped log line: {line!r}"
            out.append((int(m.group(1)), m.group(2)))
        return out

    def wait_for(self, text: str, timeout: float = 20) -> None:
        wait_for(self.text, lambda log: text in log, what=f"{text!r} in the log of {self.script.name}", timeout=timeout,
                 interval=0.01)


def state_of(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def zombie_children(ppid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == ppid and fields[0] == "Z":
                out.append(int(entry))
    return out


@pytest.mark.parametrize("source, code, expected", [
    ("print('hello')\n", 0, ["hello"]),
    ("import sys\nprint('to stderr', file=sys.stderr)\nsys.exit(0)\n", 0, ["to stderr"]),
    ("print('partial', end='')\n", 0, ["partial"]),
    ("print('bye')\nraise SystemExit(3)\n", 3, ["bye"]),
    ("raise SystemExit(5)\n", 5, []),
    ("raise SystemExit('fatal: no data')\n", 1, ["fatal: no data"]),
    ("import os\nprint('now', flush=True)\nos._exit(4)\n", 4, ["now"]),
    ("raise KeyboardInterrupt\n", -signal.SIGINT, ["KeyboardInterrupt"]),
])
def test_log_lines_are_timestamped_and_exit_codes_are_the_scripts(server, tmp_path, source, code, expected):
    run = Run(server, tmp_path, source, rank=2)
    assert run.wait() == code
    lines = run.lines()
    assert all(rank == 2 for rank, _ in lines)
    texts = [t for _, t in lines]
    for e in expected:
        assert any(e in t for t in texts), texts


def test_an_exception_exits_1_with_the_scripts_traceback_only(server, tmp_path):
    run = Run(server, tmp_path, "def f():\n    raise ValueError('boom')\n\nf()\n")
    assert run.wait() == 1
    text = run.text()
    assert "Traceback (most recent call last):" in text and "ValueError: boom" in text
    assert f'File "{run.script}", line 4, in <module>' in text and "forkserver.py" not in text


def test_sigterm_to_the_process_group_ends_the_worker_and_is_recorded(server, tmp_path):
    run = Run(server, tmp_path, "import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    assert os.getpgid(run.pid) == run.pid and os.getsid(run.pid) == run.pid  # own session and group, like today
    run.wait_for("ready")
    os.killpg(run.pid, signal.SIGTERM)
    assert run.wait() == -signal.SIGTERM


def test_a_script_that_handles_sigterm_gets_it_once(server, tmp_path):
    source = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(7)))\n"
              "print('ready', flush=True)\ntime.sleep(60)\n")
    run = Run(server, tmp_path, source)
    run.wait_for("ready")
    os.killpg(run.pid, signal.SIGTERM)
    assert run.wait() == 7
    assert run.text().count("got TERM") == 1


def test_environment_cwd_argv_and_sys_path_are_the_jobs(server, tmp_path):
    cwd = tmp_path / "home"
    cwd.mkdir()
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("VALUE = 42\n")
    source = (
        "import json, os, sys, signal, subprocess, helper_mod\n"
        "print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), 'argv': sys.argv, 'path0': sys.path[0],\n"
        "  'path1': sys.path[1], 'name': __name__, 'main': sys.modules['__main__'].__file__, 'helper': helper_mod.VALUE,\n"
        "  'term': signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, 'pipe': signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,\n"
        "  'int': signal.getsignal(signal.SIGINT) is signal.default_int_handler, 'mask': sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),\n"
        "  'child_env': subprocess.check_output(['sh', '-c', 'echo $RANK-$MY_VAR'], text=True).strip(),\n"
        "  'stdin': sys.stdin.read(), 'buffer': type(sys.stdout.buffer).__name__}))\n"
    )
    env = base_env(RANK="1", WORLD_SIZE="2", MASTER_PORT="29500", MY_VAR="x y", PYTHONPATH=str(lib))
    run = Run(server, tmp_path, source, rank=1, env=env, cwd=str(cwd))
    assert run.wait() == 0, run.text()
    got = json.loads(run.lines()[0][1])
    assert got["env"] == env  # replaced, not merged with the server's
    assert got["cwd"] == str(cwd) and got["argv"] == [str(run.script)]
    assert got["path0"] == str(tmp_path) and got["path1"] == str(lib) and got["helper"] == 42
    assert got["name"] == "__main__" and got["main"] == str(run.script)
    assert got["term"] and got["pipe"] and got["int"] and got["mask"] == []
    assert got["child_env"] == "1-x y" and got["stdin"] == "" and got["buffer"] == "FileIO"  # unbuffered, as -u


def test_the_interpreter_shuts_down_as_after_python_script(server, tmp_path):
    """Non-daemon threads are joined, atexit runs, unclosed files are flushed."""
    out = tmp_path / "unclosed.txt"
    source = (
        "import atexit, threading, time\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "def late():\n    time.sleep(0.3); print('thread done', flush=True)\n"
        "threading.Thread(target=late).start()\n"
        f"f = open({str(out)!r}, 'w'); f.write('kept')\n"
    )
    run = Run(server, tmp_path, source)
    assert run.wait() == 0
    assert [t for _, t in run.lines()] == ["thread done", "atexit ran"]
    assert out.read_text() == "kept"


def test_two_workers_run_concurrently_and_leave_no_zombies(server, tmp_path):
    # side by side, not one after the other: each worker arrives, then waits for the other to have arrived
    # too; run one after the other, the first would never see the second and exit 3 (no stopwatch needed)
    source = ("import os, pathlib, sys, time\n"
              "me = int(os.environ['RANK']); meet = pathlib.Path(os.environ['MEET'])\n"
              "(meet / f'here-{me}').touch()\n"
              "deadline = time.monotonic() + 60\n"
              "while not (meet / f'here-{1 - me}').exists():\n"
              "    if time.monotonic() > deadline: sys.exit(3)\n"
              "    time.sleep(0.01)\n"
              "print('rank', me)\n")
    runs = [Run(server, tmp_path, source, rank=r, env=base_env(RANK=str(r), MEET=str(tmp_path))) for r in (0, 1)]
    assert runs[0].pid != runs[1].pid
    assert [r.wait(timeout=90) for r in runs] == [0, 0]
    assert [r.lines()[0][1] for r in runs] == ["rank 0", "rank 1"]
    wait_for(lambda: ([state_of(r.pid) for r in runs], zombie_children(server.pid)),
             lambda seen: all(st is None for st in seen[0]) and not seen[1],
             what="both workers gone and no zombie child of the fork server", timeout=10, interval=0.02)


def test_no_go_from_the_launcher_means_nothing_runs(server, tmp_path):
    script = tmp_path / "never.py"
    script.write_text("print('ran')\n")
    with forkserver._connect(server.socket_path, 5) as s:
        forkserver._send(s, {"op": "spawn", "script": str(script), "env": base_env(), "cwd": str(tmp_path),
                             "log": str(tmp_path / "never.log"), "exit_file": str(tmp_path / "never.exit"), "rank": 0})
        pid = json.loads(forkserver._read_line(s))["pid"]
    wait_for(lambda: state_of(pid), lambda st: st is None, what=f"the unlaunched worker {pid} to be gone", timeout=10,
             interval=0.02)
    assert not (tmp_path / "never.log").exists() and not (tmp_path / "never.exit").exists()


def test_a_forked_wrapper_runs_a_cold_command_as_a_started_one_would(server, tmp_path):
    """``wrap``: worker.py's main in a fork, with the platform's environment (not the server's), stderr to its file,
    its own session, and the descriptor sent along under the number its command line names."""
    from trainhub.boundary import envexec

    job_env = {"PATH": "/usr/bin:/bin", "SECRET_OF_THE_JOB": "only through the descriptor"}
    probe = ("echo \"fd $1: $(tr '\\0' , <&\"$1\")\"; echo \"env: $(env | sort | tr '\\n' ' ')\"; "
             "echo \"session: $(ps -o sid= -p $$) own: $(ps -o sid= -p $PPID)\"; exit 5")
    # Our own number for it: a fixed one (dup2) could close a descriptor another thread of this process holds. The
    # server receives it under another number and must move it to the one the command line names.
    fd = envexec.environment_fd(job_env)
    log, exit_file, err = tmp_path / "w.log", tmp_path / "w.exit", tmp_path / "w.wrapper.err"
    platform = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MARK": "platform"}
    try:
        pid = server.wrap(["--rank", "0", "--log", str(log), "--exit-file", str(exit_file), "--cwd", str(tmp_path), "--",
                           "/bin/bash", "-c", probe, "probe", str(fd)], platform, str(err), fd)
    finally:
        os.close(fd)
    wait_for(exit_file.exists, what="the forked wrapper's exit file", timeout=20, interval=0.01)
    assert exit_file.read_text() == "5"
    text = log.read_text()
    assert f"fd {fd}: PATH=/usr/bin:/bin,SECRET_OF_THE_JOB=only through the descriptor" in text, text
    env_line = next(line for line in text.splitlines() if "env: " in line)
    assert "MARK=platform" in env_line and "SECRET_OF_THE_JOB" not in env_line, env_line  # the platform's environment
    sids = re.search(r"session: *(\d+) own: *(\d+)", text).groups()
    assert sids == (str(pid), str(pid)), (sids, pid)  # the wrapper leads a session of its own, as a started one
    wait_for(lambda: zombie_children(server.pid), lambda z: not z, what="no zombie child of the fork server", timeout=10,
             interval=0.02)


@pytest.mark.parametrize("extra, reason", [
    ({"PYTHONHASHSEED": "0"}, "PYTHONHASHSEED is set"),
    ({"PYTHONOPTIMIZE": "1"}, "PYTHONOPTIMIZE is set"),
    ({"LC_ALL": "POSIX"}, "LC_ALL differs"),
])
def test_jobs_that_change_python_start_up_are_answered_cold(server, tmp_path, extra, reason):
    with pytest.raises(ForkServerError, match=reason) as e:
        Run(server, tmp_path, "print('x')\n", env=base_env(**extra))
    assert e.value.cold


def test_the_socket_is_private_and_the_server_restarts_when_it_is_gone(server, tmp_path):
    sock = Path(server.socket_path)
    assert sock.stat().st_mode & 0o777 == 0o600
    first = server.pid
    sock.unlink()
    run = Run(server, tmp_path, "print('after restart')\n")  # the old server is replaced, the job runs warm
    assert run.wait() == 0 and "after restart" in run.text()
    assert server.pid not in (None, first) and state_of(first) is None
    os.kill(server.pid, signal.SIGKILL)  # died: started again
    server.proc.wait()
    run = Run(server, tmp_path, "print('after a crash')\n", name="again")
    assert run.wait() == 0


def test_a_long_socket_path_works(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    fs = ForkServer(str(deep / ".forkserver.sock"), str(deep / "fs.log"), server_environment(os.environ))
    try:
        fs.start()
        assert Run(fs, deep, "print('deep')\n").wait() == 0
    finally:
        fs.stop()
    assert not (deep / ".forkserver.sock").exists()


def test_a_new_service_stops_the_previous_services_server(tmp_path):
    path, log = str(tmp_path / ".forkserver.sock"), str(tmp_path / "fs.log")
    old, new = ForkServer(path, log, server_environment(os.environ)), ForkServer(path, log, server_environment(os.environ))
    old.start()
    old_pid = old.pid
    try:
        new.start()
        old.proc.wait(5)  # it was asked to stop
        assert new.pid != old_pid and Run(new, tmp_path, "print(1)\n").wait() == 0
    finally:
        new.stop()
        old.stop()


def test_server_environment_drops_secrets_and_start_up_variables():
    env = server_environment({"PATH": "/bin", "JUPYTERHUB_API_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s", "MY_PASSWORD": "p",
                              "TRAINHUB_STORAGE_OPTIONS": "{}", "PYTHONPATH": "/x", "TRAINHUB_INSTANCE": "abc",
                              "TRAINHUB_DATA_DIR": "/d", "HOME": "/h"})
    assert env == {"PATH": "/bin", "TRAINHUB_INSTANCE": "abc", "HOME": "/h", "LANG": "C.UTF-8"}


# -- through the local launcher -------------------------------------------------------------------
def job_view(key: str, script: str | None = None, command: str | None = None, workers: int = 1) -> JobView:
    return JobView(id=int(key.split("-")[1]), key=key, user="alice", name=key, command=command, script=script, workers=workers,
                   gpus=0, env={}, attempt=1, time_limit=None)


async def finish(launcher: LocalLauncher, job: JobView, state: dict, timeout: float = 20) -> list:
    return await await_for(lambda: launcher.poll(job, state), lambda statuses: all(not s.running for s in statuses),
                           what=f"every worker of {job.key} to end", timeout=timeout, interval=0.02)


async def test_launcher_forks_script_workers_warm_and_commands_cold(tmp_path):
    launcher = LocalLauncher(jobs_dir=str(tmp_path / "jobs"))
    try:
        job = job_view("j-000001", script="import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n", workers=2)
        state = await launcher.launch(job, [[], []], base_env())
        assert [w["start"] for w in state["workers"]] == ["warm", "warm"]
        assert all(os.getpgid(w["pid"]) == w["pid"] for w in state["workers"] if state_of(w["pid"]))
        statuses = await finish(launcher, job, state)
        assert [s.exit_code for s in statuses] == [0, 0]
        for w in state["workers"]:
            assert f"rank {w['rank']} of 2" in Path(w["log"]).read_text()
        # adoption after a restart: a new launcher knows nothing but the state
        assert await LocalLauncher(jobs_dir=str(tmp_path / "jobs")).adopt(job, state)

        cmd = job_view("j-000002", command="echo from bash; exit 3")
        state = await launcher.launch(cmd, [[]], base_env())
        assert state["workers"][0]["start"] == "cold"
        assert [s.exit_code for s in await finish(launcher, cmd, state)] == [3]
    finally:
        await launcher.close()
    assert launcher._forkserver.pid is None and not (tmp_path / "jobs" / ".forkserver.sock").exists()


async def test_launcher_cancel_of_a_warm_job_by_process_group(tmp_path):
    launcher = LocalLauncher(jobs_dir=str(tmp_path / "jobs"))
    try:
        job = job_view("j-000003", script="import time\nprint('up', flush=True)\ntime.sleep(60)\n")
        state = await launcher.launch(job, [[]], base_env())
        log = Path(state["workers"][0]["log"])
        await await_for(lambda: log.read_text() if log.exists() else "", lambda text: "up" in text,
                        what="'up' in the worker's log", timeout=20, interval=0.02)
        await launcher.terminate(job, state, grace=5)
        assert [s.exit_code for s in await launcher.poll(job, state)] == [-signal.SIGTERM]
    finally:
        await launcher.close()


async def test_launcher_falls_back_cold_when_the_server_cannot_start(tmp_path, caplog):
    launcher = LocalLauncher(jobs_dir=str(tmp_path / "jobs"), warm_start_timeout=2)
    launcher._forkserver = ForkServer(str(tmp_path / "jobs" / ".forkserver.sock"), str(tmp_path / "fs.log"), {},
                                      timeout=2, python=str(tmp_path / "no-such-python"))
    try:
        job = job_view("j-000004", script="print('cold but fine')\n")
        state = await launcher.launch(job, [[]], base_env())
        assert state["workers"][0]["start"] == "cold"
        assert [s.exit_code for s in await finish(launcher, job, state)] == [0]
        assert "cold but fine" in Path(state["workers"][0]["log"]).read_text()
        assert "warm start failed" in caplog.text
    finally:
        await launcher.close()


async def test_launcher_with_warm_start_off_is_cold(tmp_path):
    launcher = LocalLauncher(jobs_dir=str(tmp_path / "jobs"), warm_start=False)
    job = job_view("j-000005", script="print('x')\n")
    state = await launcher.launch(job, [[]], base_env())
    assert state["workers"][0]["start"] == "cold"
    assert [s.exit_code for s in await finish(launcher, job, state)] == [0]
    assert launcher._forkserver is None


def test_a_server_older_than_the_installed_packages_is_replaced(server, tmp_path):
    """Packages installed after it started (new .pth files) would be missed: a new server forks the job."""
    import site

    first = server.pid
    d = site.getsitepackages()[0]
    before = os.stat(d)
    os.utime(d, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    try:
        run = Run(server, tmp_path, "print('fresh')\n")
    finally:
        os.utime(d, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert run.wait() == 0 and "fresh" in run.text()
    assert server.pid != first and state_of(first) is None


async def test_the_launcher_tells_of_each_workers_end_without_being_polled(tmp_path):
    """Exit events (watch_exits, pidfds): the engine learns of an end at once, not on its next periodic pass; one call
    per worker, none again for a worker already seen, none left watched after cleanup."""
    launcher = LocalLauncher(jobs_dir=str(tmp_path / "jobs"))
    calls = []
    ended = asyncio.Event()

    def on_exit():
        calls.append(time.monotonic())
        ended.set()

    launcher.watch_exits(on_exit)
    try:
        for job, started in ((job_view("j-000001", script="import time\ntime.sleep(0.3)\n"), "warm"),
                             (job_view("j-000002", command="sleep 0.3"), "cold")):
            calls.clear()
            ended.clear()
            state = await launcher.launch(job, [[]], base_env())
            assert state["workers"][0]["start"] == started and not calls
            await asyncio.wait_for(ended.wait(), 20)  # nobody polls meanwhile
            assert Path(state["workers"][0]["exit_file"]).exists()  # the wrapper recorded the exit before it ended
            assert [s.exit_code for s in await launcher.poll(job, state)] == [0]
            await asyncio.sleep(0.1)
            assert len(calls) == 1  # a poll of an ended worker watches nothing again
            await launcher.cleanup(job, state)
            assert launcher._exit_fds == {} and launcher._watched == set()
        # a re-adopted running worker (a new launcher after a restart) is watched from its first poll
        job = job_view("j-000003", script="import time\ntime.sleep(0.5)\n")
        state = await launcher.launch(job, [[]], base_env())
        adopter = LocalLauncher(jobs_dir=str(tmp_path / "jobs"))
        seen = asyncio.Event()
        adopter.watch_exits(seen.set)
        assert [s.running for s in await adopter.poll(job, state)] == [True]
        await asyncio.wait_for(seen.wait(), 20)
        assert [s.exit_code for s in await adopter.poll(job, state)] == [0]
        await adopter.cleanup(job, state)
        await launcher.cleanup(job, state)
    finally:
        await launcher.close()
