"""The TensorBoard processes of one user's server: one per set of jobs, a few at most, none outliving it."""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyterhub.utils import random_port
from tornado import httpclient
from traitlets import Float, Integer, Unicode, default
from traitlets.config import LoggingConfigurable

from trainhub import tensorboard as tb
from trainhub.backoff import WaitTimeout, apoll
from trainhub.boundary.procs import stop_child
from trainhub.exceptions import InvalidRequest, TrainhubError
from trainhub.jobarea import env_storage_options


class TensorBoardUnavailable(TrainhubError):
    status_code = 503


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


@dataclass
class Board:
    jobs: tuple[str, ...]
    logdir: Path
    port: int
    prefix: str
    proc: subprocess.Popen
    job_json: list[dict] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)  # jobs with no event files (yet)
    used: float = field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class TensorBoards(LoggingConfigurable):
    """Starts, refreshes and stops the TensorBoards of this server (see the package docstring)."""

    base_url = Unicode("/", help="The server's base URL (its proxy route).")
    logdir_root = Unicode(help="Where the jobs' event files are gathered. Default: ~/.cache/trainhub/tensorboard.").tag(config=True)

    @default("logdir_root")
    def _logdir_root_default(self):
        return str(Path.home() / ".cache" / "trainhub" / "tensorboard")

    max_boards = Integer(3, help="TensorBoard processes kept at most; opening one more stops the least recently used.").tag(config=True)
    max_jobs = Integer(16, help="Jobs one TensorBoard may show side by side.").tag(config=True)
    max_files = Integer(10_000, help="Event files one TensorBoard may gather (over all its jobs).").tag(config=True)
    max_bytes = Integer(2 << 30, help="Bytes of event files one TensorBoard may gather (over all its jobs).").tag(config=True)
    refresh_interval = Float(30.0, help="Seconds between copies of new event files of the jobs shown (running jobs keep writing).").tag(config=True)
    start_timeout = Float(90.0, help="Seconds TensorBoard may take to answer after it starts.").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._boards: dict[tuple[str, ...], Board] = {}
        self._lock = asyncio.Lock()
        self._refresher: asyncio.Task | None = None

    def unavailable(self) -> str | None:
        """None when TensorBoard can be opened here, else why not."""
        reason = tb.installed()
        if reason:
            return reason
        import importlib.util

        if importlib.util.find_spec("jupyter_server_proxy") is None:
            return "jupyter-server-proxy is not installed in this server's environment: TensorBoard cannot be served"
        return None

    async def open(self, jobs: list[dict]) -> Board:
        """A running TensorBoard showing exactly ``jobs`` (the jobs API's JSON), started if needed."""
        reason = self.unavailable()
        if reason:
            raise TensorBoardUnavailable(reason)
        if not jobs:
            raise InvalidRequest('name at least one job: {"jobs": ["j-000042"]}')
        if len(jobs) > self.max_jobs:
            raise InvalidRequest(f"at most {self.max_jobs} jobs side by side in one TensorBoard, not {len(jobs)}")
        key = tuple(sorted(j["id"] for j in jobs))
        async with self._lock:
            board = self._boards.get(key)
            if board is not None and not board.alive:
                self._boards.pop(key)
                board = None
            if board is None:
                logdir = Path(self.logdir_root) / hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
                gathered = await self._gather(jobs, logdir)
                board = await self._start(key, logdir)
            else:
                gathered = await self._gather(jobs, board.logdir)
            board.job_json, board.empty, board.used = jobs, gathered.empty, time.monotonic()
            while len(self._boards) > self.max_boards:
                oldest = min(self._boards.values(), key=lambda b: b.used)
                self._stop(self._boards.pop(oldest.jobs))
            if self._refresher is None or self._refresher.done():
                self._refresher = asyncio.create_task(self._refresh(), name="trainhub-tensorboard-refresh")
        return board

    async def _gather(self, jobs: list[dict], logdir: Path) -> tb.Gathered:
        return await asyncio.to_thread(tb.gather, jobs, logdir, env_storage_options(),
                                       max_files=self.max_files, max_bytes=self.max_bytes)

    async def _start(self, key: tuple[str, ...], logdir: Path) -> Board:
        port = random_port()
        prefix = tb.proxy_prefix(self.base_url, port)
        log = open(logdir / "tensorboard.log", "ab")
        try:
            proc = subprocess.Popen(tb.command(logdir, port, prefix), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, start_new_session=True)
        finally:
            log.close()
        board = Board(key, logdir, port, prefix, proc)
        self._boards[key] = board
        url = f"http://127.0.0.1:{port}{prefix}/"

        async def answers() -> bool:
            if not board.alive:
                raise TensorBoardUnavailable(f"TensorBoard exited with code {proc.returncode}; see {logdir / 'tensorboard.log'}")
            try:
                r = await httpclient.AsyncHTTPClient().fetch(url, raise_error=False, request_timeout=5, follow_redirects=False)
            except OSError:
                return False
            return r.code < 500 and r.code != 599

        try:
            await apoll(answers, what=f"TensorBoard on port {port} to answer", start=0.2, cap=2.0, timeout=self.start_timeout)
        except (WaitTimeout, TensorBoardUnavailable) as e:
            self._stop(self._boards.pop(key))
            raise TensorBoardUnavailable(str(e)) from None
        self.log.info("TensorBoard for %s on port %d (%s)", ", ".join(key), port, logdir)
        return board

    async def _refresh(self) -> None:
        """Copy new event files of the jobs shown while any TensorBoard lives."""
        while self._boards:
            await asyncio.sleep(self.refresh_interval)
            for board in list(self._boards.values()):
                if not board.alive:
                    self._boards.pop(board.jobs, None)
                    continue
                try:
                    await self._gather(board.job_json, board.logdir)
                except Exception as e:  # storage hiccup or a limit: the board keeps what it has
                    self.log.warning("TensorBoard for %s: refreshing its event files failed: %s", ", ".join(board.jobs), e)

    def _stop(self, board: Board) -> None:
        stop_child(board.proc)

    def stop_all(self) -> None:
        for board in list(self._boards.values()):
            self._stop(board)
        self._boards.clear()
        if self._refresher is not None:
            self._refresher.cancel()
