"""Wakes the followers of a job's logs when its folder changes, so a follow streams a line as it is written.

``GET /jobs/{id}/logs?follow=true`` used to look for new lines every 0.25 s: a line's way to a notebook was a
poll interval long. Here one inotify instance per service (``inotify_simple``, read on the event loop) watches,
for the jobs being followed, the folder the job's folder appears in, the job's folder (attempts appear there)
and each attempt's folder (its workers' logs): any change wakes that job's followers at once; the engine wakes
them too when an attempt ends (:meth:`LogWatch.notify`). Watches are counted per folder and dropped with the last
follower. Where inotify is not there (another OS, the instance or watch limits reached, a file system that does
not report changes) a follower wakes every ``fallback`` seconds, as before: nothing is missed, only later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from trainhub.backoff import wait_event

log = logging.getLogger(__name__)

try:
    from inotify_simple import INotify
    from inotify_simple import flags as _flags

    _MASK = _flags.CREATE | _flags.MOVED_TO | _flags.MODIFY | _flags.CLOSE_WRITE | _flags.DELETE_SELF
except ImportError:  # pragma: no cover (not Linux)
    INotify = None
    _MASK = 0


class LogWatch:
    """One inotify instance for every follower of the service; see the module docstring."""

    def __init__(self, fallback: float = 0.25):
        self.fallback = fallback
        self._inotify = None
        self._broken = INotify is None
        self._wd_dir: dict[int, Path] = {}
        self._dir_wd: dict[Path, list] = {}  # folder -> [wd, followers using it]
        self._followers: dict[Path, set[Follower]] = {}  # job folder -> its followers

    @contextlib.contextmanager
    def follow(self, job_dir: str):
        """A :class:`Follower` of ``job_dir`` for the length of one follow."""
        follower = Follower(self, Path(job_dir))
        try:
            yield follower
        finally:
            follower.close()

    def notify(self, job_dir: str) -> None:
        """Wake the followers of ``job_dir`` (its job's attempt ended: they look at its state)."""
        self._wake(Path(job_dir))

    # -- inotify ----------------------------------------------------------------------------------------------------
    def _start(self) -> bool:
        if self._inotify is None and not self._broken:
            try:
                self._inotify = INotify(nonblocking=True)
                asyncio.get_running_loop().add_reader(self._inotify.fileno(), self._read)
            except OSError as e:  # EMFILE: the user's inotify instances are all taken
                log.warning("log follows poll every %.2f s: no inotify (%s)", self.fallback, e)
                self._broken = True
                self._inotify = None
        return self._inotify is not None

    def _add(self, folder: Path) -> bool:
        """Count one more user of a watch on ``folder``; False if it cannot be watched (missing, or no watch left)."""
        entry = self._dir_wd.get(folder)
        if entry is not None:
            entry[1] += 1
            return True
        if not self._start():
            return False
        try:
            wd = self._inotify.add_watch(folder, _MASK)
        except FileNotFoundError:
            return False
        except OSError as e:  # ENOSPC: max_user_watches reached; the follower falls back to its timer
            log.warning("cannot watch %s for log follows: %s", folder, e)
            return False
        self._wd_dir[wd] = folder
        entry = self._dir_wd.setdefault(folder, [wd, 0])
        entry[1] += 1
        return True

    def _remove(self, folder: Path) -> None:
        entry = self._dir_wd.get(folder)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del self._dir_wd[folder]
            self._wd_dir.pop(entry[0], None)
            with contextlib.suppress(OSError):  # gone with its folder already
                self._inotify.rm_watch(entry[0])

    def _read(self) -> None:
        try:
            events = self._inotify.read(timeout=0)
        except OSError:
            return
        for ev in events:
            if ev.wd < 0:  # the queue overflowed: events were lost, wake everyone
                for key in list(self._followers):
                    self._wake(key)
                continue
            folder = self._wd_dir.get(ev.wd)
            if folder is None:  # a watch dropped meanwhile (its last events, IN_IGNORED)
                continue
            if ev.mask & _flags.IGNORED:  # the folder went: its watch is gone
                self._wd_dir.pop(ev.wd, None)
                self._dir_wd.pop(folder, None)
            # a follower's key is its job folder: the event is about it, in it (an attempt folder), or in one of its
            # attempts (a worker's log). The rest (the script, outputs/, metrics, exit files) is not what a follower
            # reads: a job's start writes a dozen of them, each a wake of every follower on the way to its first line
            if not ev.name:  # about the watched folder itself (gone, its watch dropped)
                self._wake(folder)
                self._wake(folder.parent)
                continue
            self._wake(folder / ev.name)
            if ev.name.startswith("attempt-"):
                self._wake(folder)
            if ev.name.startswith("worker-") and ev.name.endswith(".log"):
                self._wake(folder.parent)

    def _wake(self, key: Path) -> None:
        for follower in self._followers.get(key, ()):
            follower.event.set()

    def close(self) -> None:
        if self._inotify is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
        self._wd_dir.clear()
        self._dir_wd.clear()


class Follower:
    """What one follow of one job folder watches: the folder it appears in, the folder, and its attempt folders.

    A change seen while the follower is busy (writing lines out) is kept, so the next :meth:`changed` returns at
    once: no line written between a read and the wait is left for the fallback timer."""

    def __init__(self, watch: LogWatch, job_dir: Path):
        self.watch = watch
        self.job_dir = job_dir
        self.event = asyncio.Event()
        self._watched: set[Path] = set()
        watch._followers.setdefault(job_dir, set()).add(self)
        self._ensure()

    def _ensure(self) -> tuple[bool, bool]:
        """Watch what exists now, parents first (what is created between a listing and its watch is seen in the
        parent). ``(all watched, something newly watched)``."""
        ok, added = True, False
        wanted = [self.job_dir.parent, self.job_dir]
        with contextlib.suppress(OSError):
            wanted += sorted(p for p in self.job_dir.iterdir() if p.name.startswith("attempt-") and p.is_dir())
        for folder in wanted:
            if folder in self._watched and folder in self.watch._dir_wd:
                continue
            self._watched.discard(folder)  # its watch went with the folder: watch the one there now
            if self.watch._add(folder):
                self._watched.add(folder)
                added = True
            elif folder != self.job_dir or os.path.exists(folder):
                ok = False
        return ok, added

    async def changed(self, timeout: float) -> None:
        """Return when something in the job's folder changed since the last call, the engine woke its followers,
        or after ``timeout`` (``watch.fallback`` at most when the folder cannot be watched)."""
        ok, added = self._ensure()
        if added:  # a new attempt folder: what its workers wrote before the watch is read now
            self.event.clear()
            return
        if not ok:
            timeout = min(timeout, self.watch.fallback)
        if not self.event.is_set():
            await wait_event(self.event, timeout)
        self.event.clear()

    def close(self) -> None:
        followers = self.watch._followers.get(self.job_dir)
        if followers is not None:
            followers.discard(self)
            if not followers:
                del self.watch._followers[self.job_dir]
        for folder in self._watched:
            self.watch._remove(folder)
        self._watched.clear()
