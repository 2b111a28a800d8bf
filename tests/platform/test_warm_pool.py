"""The warm pool of isolated job workers (services/jobs/warmpool.py), its mechanics without root: plain entries
(no sandbox, the service's own account) with the same wrapper and inside as isolated ones. A claimed entry runs the
job's script as its worker and the wrapper records it; entries wait nicer, take on only the job's environment, are
discarded when a claim fails, and end with the service that started them. The launcher's use of the pool, as root
with real accounts and sandboxes, is tests/platform/test_warm_jobs.py.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from waiting import wait_for

from trainhub.services.jobs import warmpool
from trainhub.services.jobs import worker as worker_mod
from trainhub.services.jobs.local import WARM_INSIDE_SCRIPT, WORKER_SCRIPT

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="accounts need root (CI runs as root)")


def base_env(**extra) -> dict:
    return {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "LANG": os.environ.get("LANG", "C.UTF-8"), **extra}


def plain_pool(size: int = 1, inside: str = WARM_INSIDE_SCRIPT, nice: int = 0) -> warmpool.WorkerPool:
    """Entries without sandbox or account: the wrapper and the inside exactly as isolated ones, minus bwrap."""
    def argv_for(claim_fd, ctl_fd):
        return [sys.executable, "-S", "-P", WORKER_SCRIPT, "--warm", str(ctl_fd), "--",
                sys.executable, "-u", inside, str(claim_fd)]

    return warmpool.WorkerPool(argv_for, warmpool.launch_env(), size, logging.getLogger("test-warm-jobs"), nice=nice)


def spec_for(script: Path, cwd: Path, **env) -> dict:
    return {"script": str(script), "args": [], "env": base_env(HOME=str(cwd), **env), "cwd": str(cwd), "umask": 0o077,
            "uid": None, "gid": None}


def test_an_entry_runs_the_script_as_its_worker_and_the_wrapper_records_it(tmp_path):
    pool = plain_pool(2)
    pool.fill()
    try:
        script = tmp_path / "job.py"
        script.write_text("import os, sys\nprint('hello', os.environ['GREETING'], sys.argv[0], __name__)\nsys.exit(3)\n")
        entry = pool.take(30)
        assert entry is not None and entry.ready and entry not in pool.waiting
        log, exit_file = tmp_path / "w.log", tmp_path / "w.exit"
        pid = pool.claim(entry, spec_for(script, tmp_path, GREETING="warm"), [],
                         {"rank": 4, "log": str(log), "exit_file": str(exit_file)}, 30)
        assert pid == entry.pid and os.getpgid(pid) == pid and pool.claims == 1
        wait_for(exit_file.exists, what="the exit file", timeout=30, interval=0.02)
        assert exit_file.read_text() == "3"
        assert f"[4] hello warm {script} __main__" in log.read_text()
        assert entry.proc.wait(10) == 0
    finally:
        pool.close()


def test_a_refill_starting_entries_does_not_hold_up_a_launch_taking_one():
    """Entries start outside the pool's lock: a launch on the event loop takes a ready entry at once, never behind a
    refill's process starts."""
    pool = plain_pool(1)
    pool.fill()
    try:
        wait_for(pool.has_ready, what="an entry ready", timeout=30, interval=0.02)
        real_start, in_start, go_on = pool._start, threading.Event(), threading.Event()

        def held_start():  # a start that lasts until the entry was taken
            in_start.set()
            go_on.wait(30)
            return real_start()

        pool._start, pool.size = held_start, 2
        refill = threading.Thread(target=pool.fill)
        refill.start()
        taken: list = []
        try:
            assert in_start.wait(10)
            taker = threading.Thread(target=lambda: taken.append(pool.take_ready()))
            taker.start()
            taker.join(10)
            assert taken and taken[0] is not None, "take_ready waited for the refill's start"
        finally:
            go_on.set()
        taken[0].discard()
        refill.join(30)
        taker.join(30)
        assert len(pool.waiting) == 1  # the refill's entry
    finally:
        pool.close()


def test_a_claimed_entrys_proc_environ_is_the_jobs_not_the_pools(tmp_path, caplog):
    """/proc/<pid>/environ of the claimed interpreter, read from outside (``ps e``, procs.processes_with), is the
    job's environment as envexec's execve gives a cold worker, not the pool entry's launch environment."""
    pool = plain_pool(1)
    pool.fill()
    entry = None
    try:
        script = tmp_path / "job.py"
        script.write_text("import os, time\nopen(os.environ['STARTED'], 'w').close()\ntime.sleep(120)\n")
        entry = pool.take(30)
        inside = [p for p in warmpool.process_tree(entry.pid) if p != entry.pid]
        assert len(inside) == 1
        launched = dict(e.split("=", 1) for e in Path(f"/proc/{inside[0]}/environ").read_text().split("\0") if e)
        assert launched == dict(warmpool.launch_env(), TRAINHUB_HOLDER=entry.token)
        spec = spec_for(script, tmp_path, STARTED=str(tmp_path / "started"), TRAINHUB_HOLDER=entry.token, JOB_ONLY="x y")
        with caplog.at_level(logging.INFO, logger="test-warm-jobs"):
            worker = {"rank": 0, "log": str(tmp_path / "w.log"), "exit_file": str(tmp_path / "w.exit")}
            pool.claim(entry, spec, [], worker, 30)
        wait_for((tmp_path / "started").exists, what="the job to start", timeout=30, interval=0.02)
        raw = Path(f"/proc/{inside[0]}/environ").read_bytes()
        assert raw.endswith(b"\0")
        assert dict(e.split("=", 1) for e in raw.decode().split("\0") if e) == spec["env"]
        assert not [r for r in caplog.records if "environ" in r.getMessage()], caplog.text
    finally:
        if entry is not None:
            for p in warmpool.process_tree(entry.pid)[::-1]:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            entry.proc.wait(10)
        pool.close()


@root_only
def test_entries_wait_nicer_and_their_job_runs_at_the_services_priority(tmp_path):
    pool = plain_pool(1, nice=warmpool.WAIT_NICE)
    pool.fill()
    try:
        entry = pool.waiting[0]
        wait_for(lambda: entry.check_ready(0.1), what="the entry to be ready", timeout=30)
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        tree = warmpool.process_tree(entry.pid)
        assert len(tree) == 2 and {os.getpriority(os.PRIO_PROCESS, p) for p in tree} == {min(19, mine + warmpool.WAIT_NICE)}
        script = tmp_path / "job.py"
        script.write_text("import os\nprint('nice', os.getpriority(os.PRIO_PROCESS, 0))\n")
        taken = pool.take(30)
        log, exit_file = tmp_path / "w.log", tmp_path / "w.exit"
        pool.claim(taken, spec_for(script, tmp_path), [], {"rank": 0, "log": str(log), "exit_file": str(exit_file)}, 30)
        wait_for(exit_file.exists, what="the exit file", timeout=30, interval=0.02)
        assert f"nice {mine}" in log.read_text()
    finally:
        pool.close()


def test_entries_start_nicer_from_their_first_instruction_and_the_filling_thread_is_put_back(tmp_path):
    """A refill's entries are nicer already when their first process starts (the wrapper's own start-up competes with
    the jobs just started otherwise), and the thread that filled the pool is as nice as before."""
    seen = tmp_path / "nice"

    def argv_for(claim_fd, ctl_fd):
        return [sys.executable, "-S", "-c",
                f"import os; open({str(seen)!r} + '.tmp', 'w').write(str(os.getpriority(os.PRIO_PROCESS, 0))); "
                f"os.rename({str(seen)!r} + '.tmp', {str(seen)!r})"]

    pool = warmpool.WorkerPool(argv_for, warmpool.launch_env(), 1, logging.getLogger("test-warm-jobs"),
                               nice=warmpool.WAIT_NICE)
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        assert pool.fill() == 1
        wait_for(seen.exists, what="the entry's first instruction", timeout=30, interval=0.02)
        assert int(seen.read_text()) == min(19, mine + warmpool.WAIT_NICE)
        if os.geteuid() == 0:  # (only root may raise a priority again)
            assert os.getpriority(os.PRIO_PROCESS, 0) == mine
    finally:
        pool.close()


def test_a_failed_claim_discards_the_entry_and_records_nothing(tmp_path):
    pool = plain_pool(1)
    pool.fill()
    try:
        entry = pool.take(30)
        log, exit_file = tmp_path / "w.log", tmp_path / "w.exit"
        with pytest.raises(warmpool.WarmUnavailable, match="missing"):
            pool.claim(entry, spec_for(tmp_path / "job.py", tmp_path / "missing"), [],
                       {"rank": 0, "log": str(log), "exit_file": str(exit_file)}, 30)
        assert entry.proc.wait(10) in (0, -signal.SIGKILL) and pool.claims == 0 and entry not in pool.waiting
        assert not log.exists() and not exit_file.exists()
    finally:
        pool.close()


@pytest.mark.parametrize("first, recorded", [(b"", False), (b"hello before being taken on\n", False),
                                             (worker_mod.TAKEN_ON, True)])
def test_a_warm_wrapper_records_only_once_its_interpreter_took_the_job_on(tmp_path, first, recorded):
    """The wrapper learns its log before the interpreter gets the job: until the interpreter's first bytes say it took
    the job on, nothing of a failed claim (an exit without them, or output that is not them) reaches the log."""
    import socket
    import subprocess

    ctl, ctl_child = socket.socketpair()
    cmd = [sys.executable, "-c", f"import os, sys; os.write(1, {first!r}); print('the job', flush=True); sys.exit(3)"]
    proc = subprocess.Popen([sys.executable, "-S", "-P", WORKER_SCRIPT, "--warm", str(ctl_child.fileno()), "--", *cmd],
                            pass_fds=(ctl_child.fileno(),), start_new_session=True)
    ctl_child.close()
    log, exit_file = tmp_path / "w.log", tmp_path / "w.exit"
    ctl.sendall(json.dumps({"rank": 2, "log": str(log), "exit_file": str(exit_file)}).encode() + b"\n")
    ctl.close()
    assert proc.wait(30) == 0
    if recorded:
        assert exit_file.read_text() == "3"
        lines = log.read_text().splitlines()
        assert len(lines) == 1 and lines[0].endswith("[2] the job") and "taken on" not in log.read_text()
    else:
        assert not log.exists() and not exit_file.exists()


def test_entries_let_go_leave_no_trace_and_no_process(tmp_path):
    pool = plain_pool(2)
    pool.fill()
    entries = list(pool.waiting)
    assert len(entries) == 2
    wait_for(lambda: all(e.check_ready(0.1) for e in entries), what="both entries ready", timeout=30)
    pool.close()
    for e in entries:
        assert e.proc.wait(10) in (0, -signal.SIGKILL)
    assert pool.waiting == [] and not list(tmp_path.iterdir())


OWNER = r"""
import logging, os, sys, time
sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]
from test_warm_pool import plain_pool
pool = plain_pool(2)
pool.fill()
for e in pool.waiting:
    e.check_ready(30)
print(" ".join(str(e.pid) for e in pool.waiting), flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_entries_of_a_service_that_died_end_with_it(tmp_path):
    """A jobs service killed outright (no close()): its entries see their sockets close and exit, leaving nothing."""
    import subprocess

    owner = subprocess.Popen([sys.executable, "-c", OWNER, os.path.dirname(__file__)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2
        owner.kill()
        owner.wait(10)
        wait_for(lambda: not any(alive(p) for p in pids), what="the dead service's entries to exit", timeout=20, interval=0.05)
    finally:
        if owner.poll() is None:
            owner.kill()


def test_an_entry_that_does_not_start_is_never_handed_out(tmp_path):
    bad = tmp_path / "broken_inside.py"
    bad.write_text("raise SystemExit(5)\n")
    pool = plain_pool(1, inside=str(bad))
    pool.fill()
    try:
        assert pool.take(10) is None
    finally:
        pool.close()


def test_start_up_variables_that_a_started_interpreter_cannot_take_on_mean_cold():
    launched = warmpool.launch_env()
    assert warmpool.refusal(dict(launched, PYTHONPATH="/x", PYTHONUNBUFFERED="1", HOME="/h"), launched) == ""
    why = warmpool.refusal(dict(launched, PYTHONHASHSEED="0", LD_PRELOAD="/x.so", LC_ALL="C"), launched)
    assert "LC_ALL" in why and "LD_PRELOAD" in why and "PYTHONHASHSEED" in why
    assert "LANG" in warmpool.refusal(dict(launched, LANG="de_DE.UTF-8"), launched)


def test_a_warm_interpreter_whose_hub_is_gone_exits_quietly(tmp_path):
    """A hub that stops (Ctrl-C) while a warm interpreter still imports: its "ready" meets a closed socket. It exits 0
    with nothing on its output; it printed a BrokenPipeError traceback into the terminal of `make up`."""
    import socket
    import subprocess
    import sys

    ours, theirs = socket.socketpair()
    code = ("import socket, sys\n"
            "from trainhub.boundary.warmsandbox import serve_claim\n"
            "sock = socket.socket(fileno=int(sys.argv[1]))\n"
            "sys.stdin.read()  # 'imports' until the hub is gone\n"
            "serve_claim(sock, lambda spec, fds: None)\n"
            "print('claimed')\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    theirs.close()
    ours.close()  # the hub's end of the socket, closed as the hub exits
    out, _ = proc.communicate(b"", timeout=60)
    assert proc.returncode == 0 and out == b"", out
