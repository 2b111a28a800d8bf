"""The optuna-dashboard process of one user's server (one at most, none outliving the server)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from jupyterhub.utils import random_port
from tornado import httpclient
from traitlets import Float, Unicode
from traitlets.config import LoggingConfigurable

from trainhub.backoff import WaitTimeout, apoll
from trainhub.boundary.procs import stop_child
from trainhub.exceptions import NotFound, TrainhubError
from trainhub.runtime import optuna_storage


class DashboardUnavailable(TrainhubError):
    status_code = 503


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


class Dashboard(LoggingConfigurable):
    base_url = Unicode("/", help="The server's base URL (its proxy route).")
    start_timeout = Float(60.0, help="Seconds optuna-dashboard may take to answer after it starts.").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.proc: subprocess.Popen | None = None
        self.prefix = ""
        self._lock = asyncio.Lock()

    @property
    def storage(self) -> str:
        return optuna_storage()

    @property
    def path(self) -> Path:
        return Path(self.storage.removeprefix("sqlite:///"))

    def unavailable(self) -> str | None:
        import importlib.util

        for module, package in (("optuna_dashboard", "optuna-dashboard"), ("jupyter_server_proxy", "jupyter-server-proxy")):
            if importlib.util.find_spec(module) is None:
                return f"{package} is not installed in this server's environment: the Optuna dashboard cannot be served"
        return None

    async def open(self) -> str:
        """The dashboard's URL (root-relative, ending with ``/``), started if needed."""
        reason = self.unavailable()
        if reason:
            raise DashboardUnavailable(reason)
        if not self.path.is_file():
            raise NotFound(f"no copy of your studies yet at {self.path}: it is written when a trial of one of your "
                           "sweeps finishes")
        async with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                await self._start()
        return self.prefix

    async def _start(self) -> None:
        port = random_port()
        prefix = f"{self.base_url.rstrip('/')}/proxy/absolute/{port}/"
        log_path = Path.home() / ".cache" / "trainhub" / "optuna-dashboard.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = proc = subprocess.Popen(
                [sys.executable, "-m", "trainhub.extensions.optunadash.serve", "--port", str(port), "--prefix", prefix,
                 self.storage], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent, start_new_session=True, env=os.environ.copy())
        url = f"http://127.0.0.1:{port}{prefix}api/meta"

        async def answers() -> bool:
            if proc.poll() is not None:
                raise DashboardUnavailable(f"optuna-dashboard exited with code {proc.returncode}; see {log_path}")
            try:
                r = await httpclient.AsyncHTTPClient().fetch(url, raise_error=False, request_timeout=5)
            except OSError:
                return False
            return r.code == 200

        try:
            await apoll(answers, what=f"optuna-dashboard on port {port} to answer", start=0.2, cap=2.0,
                        timeout=self.start_timeout)
        except (WaitTimeout, DashboardUnavailable) as e:
            self.stop()
            raise DashboardUnavailable(str(e)) from None
        self.prefix = prefix
        self.log.info("optuna-dashboard on port %d (%s)", port, self.storage)

    def study_id(self, name: str) -> int | None:
        """The id of study ``name`` in the copy (the dashboard's URLs use it), None when it is not there. Blocking."""
        import sqlite3

        try:
            with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5) as db:
                row = db.execute("SELECT study_id FROM studies WHERE study_name = ?", (name,)).fetchone()
        except sqlite3.Error:
            return None
        return int(row[0]) if row else None

    def stop(self) -> None:
        stop_child(self.proc)
        self.proc = None
