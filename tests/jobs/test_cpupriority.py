"""The jobs service's CPU priority (trainhub.cpupriority, issue 35): its session's autogroup niceness, set at start.

Each check runs in a child process in a session of its own, so the test's own session is left as it was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainhub.cpupriority import autogroups_enabled

pytestmark = pytest.mark.skipif(not autogroups_enabled(), reason="this kernel shares the CPU by process, not by session")


def in_own_session(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, start_new_session=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_session_gets_the_niceness_asked_for_and_says_when_it_cannot():
    out = in_own_session("from trainhub.cpupriority import *; print(set_session_nice(5), session_nice())")
    assert out == "None 5"
    # a process may lower its session's priority but raise it again only with CAP_SYS_NICE
    out = in_own_session("import os\nfrom trainhub.cpupriority import *\nset_session_nice(5)\n"
                         "os.setuid(65534) if os.geteuid() == 0 else None\nprint(set_session_nice(-1))")
    assert "needs CAP_SYS_NICE" in out, out


def test_the_jobs_service_asks_for_the_platform_priority_for_its_session_at_start(tmp_path):
    code = f"""
import logging
from traitlets.config import Config
from trainhub.gpus import simulated_devices
from trainhub.settings import Runtime
from trainhub.services.jobs.app import JobsService
from trainhub.cpupriority import session_nice
Runtime(data_dir={str(tmp_path)!r}, devices=[d.to_dict() for d in simulated_devices(1)], simulated=True).save()
c = Config(); c.Isolation.allow_shared_account = True; c.JobsService.session_nice = 3
app = JobsService(config=c); app.initialize(["--data-dir", {str(tmp_path)!r}])
app.tune_interpreter()
print(session_nice())
"""
    assert in_own_session(code).splitlines()[-1] == "3"


@pytest.mark.skipif(os.geteuid() != 0, reason="a niceness below 0 needs root (CI runs as root)")
def test_trainhub_up_gives_the_hub_and_the_proxy_the_platform_priority(tmp_path):
    """`trainhub up` (platform_priority, after each start of the hub): the hub's session and the proxy's (its pid
    file) run at JobsService.session_nice, so a spawn's own work in the hub does not wait behind the servers it starts."""
    from trainhub.app.up import platform_priority
    from trainhub.cpupriority import PLATFORM_NICE, session_nice
    from trainhub.gpus import simulated_devices
    from trainhub.settings import DataDir, Runtime

    Runtime(data_dir=str(tmp_path), devices=[d.to_dict() for d in simulated_devices(1)], simulated=True).save()
    hub, proxy = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
                  for _ in range(2))
    try:
        (tmp_path / "proxy.pid").write_text(f"{proxy.pid}\n")
        assert (session_nice(hub.pid), session_nice(proxy.pid)) == (0, 0)
        platform_priority(DataDir(tmp_path), hub.pid)
        assert (session_nice(hub.pid), session_nice(proxy.pid)) == (PLATFORM_NICE, PLATFORM_NICE)
    finally:
        for p in (hub, proxy):
            p.kill()
            p.wait()
