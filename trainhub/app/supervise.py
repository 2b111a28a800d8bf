"""The hub as `trainhub up` runs it: started, restarted when it dies, stopped when asked.

JupyterHub is one process; without a supervisor a crash (or an OOM kill) of it took the whole platform
down until someone ran `make up` again. `trainhub up` therefore starts the hub again when it exits
without being asked to, up to ``MAX_RESTARTS`` times in ``RESTART_WINDOW`` seconds (then the platform
stops, saying why). What lives on through a restart:

- users' servers and kernels: each runs under a keeper (trainhub.boundary.keeper), adopted by
  `trainhub up` when the hub dies; the new hub finds each by its pid and port in the spawner's state
  and routes to it again;
- jobs: their wrappers never belonged to the hub; the jobs service started anew re-adopts them;
- the ledger: held devices stay with the servers and jobs that hold them (their processes live);
- users' network namespaces and their gate: they belong to `trainhub up`, not to the hub.

The old proxy is replaced by the new hub (JupyterHub ends it through its pid file). The old jobs
service and culler are ended first (SIGTERM, their own processes only: a job's wrapper is not theirs to
take along), so the new hub's start them on their ports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from trainhub.backoff import poll
from trainhub.boundary.procs import descendants, processes_with, reap_adopted, terminate

MAX_RESTARTS = 5
RESTART_WINDOW = 600.0  # seconds
SERVICE_NAMES = ("trainhub", "trainhub-culler")


#: what JupyterHub logs once its proxy routes to it and its services run (INFO): `trainhub up` waits for this line
#: instead of asking the proxy's API for its routes several times a second (each request one line in the log)
RUNNING_LINE = b"JupyterHub is now running at"


#: how JupyterHub's INFO lines start (its default log format): a hub that logs them will say RUNNING_LINE too
INFO_PREFIX = b"[I "


class HubOutput:
    """What `trainhub up` learns from one hub process's output."""

    def __init__(self):
        self.running = threading.Event()  # it said RUNNING_LINE
        self.logs_info = threading.Event()  # it logs at INFO (so RUNNING_LINE will come)

    def see(self, line: bytes) -> None:
        if not self.logs_info.is_set() and line.startswith(INFO_PREFIX):
            self.logs_info.set()
        if not self.running.is_set() and RUNNING_LINE in line:
            self.running.set()


def _pump(stream, sinks, seen: HubOutput | None = None):
    for line in iter(stream.readline, b""):
        if seen is not None:
            seen.see(line)
        for sink in sinks:
            try:
                sink.write(line)
                sink.flush()
            except ValueError:
                pass


class SupervisedHub:
    """One JupyterHub process at a time, its output copied to ``sinks``."""

    def __init__(self, cmd: list[str], env: dict, cwd: str, sinks, out=sys.stderr):
        self.cmd, self.env, self.cwd, self.sinks, self.out = cmd, env, cwd, sinks, out
        self.proc: subprocess.Popen | None = None
        self.pumps: list[threading.Thread] = []
        self.restarts: list[float] = []
        self.output = HubOutput()  # the current hub's

    def start(self) -> subprocess.Popen:
        """A new hub process, in a session of its own: a Ctrl-C in the terminal reaches `trainhub up` alone, which
        asks the hub to stop once (SIGTERM). In the terminal's process group the hub also got the SIGINT itself and
        ran JupyterHub's shutdown twice at once (servers stopped twice: "Failed to stop user: ''", a KeyError, tasks
        destroyed while pending)."""
        self.output = HubOutput()
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.cwd,
                                     start_new_session=True)
        pump = threading.Thread(target=_pump, args=(self.proc.stdout, self.sinks, self.output), daemon=True)
        pump.start()
        self.pumps.append(pump)
        return self.proc

    def signal(self, sig: int) -> None:
        try:
            if self.proc is not None:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def _exited(self):
        reap_adopted(skip={self.proc.pid})  # keepers of servers whose hub died: their exit must show to the new hub
        return self.proc.poll()

    def supervise(self, stopping: threading.Event, wait_up, instance: str) -> int:
        """Until a stop is asked (``stopping``): restart the hub whenever it exits; returns its last exit code."""
        while True:
            code = poll(self._exited, lambda rc: rc is not None, what="JupyterHub to exit", start=0.2, factor=1.0)
            if stopping.is_set():
                return code
            now = time.monotonic()
            self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW]
            if len(self.restarts) >= MAX_RESTARTS:
                print(f"trainhub: JupyterHub exited with code {code}, its {MAX_RESTARTS + 1}th exit within "
                      f"{RESTART_WINDOW / 60:.0f} minutes: stopping the platform (see logs/jupyterhub.log)",
                      file=self.out, flush=True)
                return code
            self.restarts.append(now)
            print(f"trainhub: JupyterHub exited with code {code}; starting it again (servers, kernels and jobs keep "
                  "running)", file=self.out, flush=True)
            self.end_services(instance)
            if stopping.is_set():
                return code
            proc = self.start()
            try:
                wait_up(proc, self.output)
            except Exception as e:  # it did not come up: the next round counts it as one more exit
                print(f"trainhub: JupyterHub did not come back: {e}", file=self.out, flush=True)
                self.signal(signal.SIGTERM)

    def end_services(self, instance: str, grace: float = 10.0) -> list[int]:
        """The old hub's jobs service and culler (adopted by this process now): the new hub starts its own."""
        mine = set(descendants([os.getpid()]))
        pids = [p for name in SERVICE_NAMES for p in processes_with("JUPYTERHUB_SERVICE_NAME", name)
                if p in mine and p in set(processes_with("TRAINHUB_INSTANCE", instance))]
        if pids:
            terminate(pids, grace, tree=False)
        return pids

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def join_output(self) -> None:
        for pump in self.pumps:
            pump.join(timeout=2)
