"""Each user's own copy of their Optuna studies, in their home, for Optuna's own tools.

The studies live in the platform database (``RDBStorage``), which only the platform can read. So that a user can
open their sweeps with ``optuna.load_study`` and optuna-dashboard, the jobs service keeps, per user, an SQLite
Optuna storage ``~/.trainhub/optuna/studies.db`` (:data:`trainhub.runtime.OPTUNA_COPY`) holding a copy of each of
that user's studies, named by the sweep's id (``s-000003``), refreshed when a trial finishes (once Optuna has been
told its outcome) and when a sweep ends.

Boundary by construction (docs/isolation.md):

- **only one's own studies**: the copy of a user is built from that user's sweeps only, in a file of the platform
  (``<data-dir>/optuna-copies/<digest of the user>.db``, 0600, in a 0700 folder no user can reach), updated one
  study at a time (``optuna.copy_study``);
- **written as the user**: the finished file is copied into the home through
  :class:`~trainhub.boundary.files.UserTree` as the user (their fsuid/fsgid, by descriptors, a temporary name and
  a rename in the folder): a link planted at ``.trainhub``, ``.trainhub/optuna`` or the file is never followed
  (a link in place of a folder fails the refresh; one in place of the file is replaced by the rename), and the
  file is the user's, 0600, in their 0700 home;
- **read-only in effect**: nothing ever reads the user's file back; writing to it changes nothing on the platform
  and the next refresh replaces it.

A home that does not exist yet (a user who never started a server or a job) is left alone; the refresh after
the next trial writes the copy. Blocking work runs on one thread of its own, never on the event loop, and never on
the controller's Optuna thread (so a slow home never delays a trial's start).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainhub.runtime import OPTUNA_COPY

from .models import Sweep, study_name, sweep_key

COPIES_FOLDER = "optuna-copies"


def copy_name(user: str) -> str:
    """The platform's file of ``user``'s copy (a digest: user names are not all file names)."""
    return hashlib.sha256(user.encode()).hexdigest()[:32] + ".db"


class StudyCopies:
    """The per-user copies of a controller's studies. ``platform_storage()`` gives Optuna's storage of the platform
    (called on this class's thread); ``sweeps_of(user)`` the user's sweeps (sync); ``home_of(user)`` their home
    ("" none on this back end); ``as_user(user)`` the :class:`~trainhub.boundary.asuser.AsUser` to write as."""

    def __init__(self, folder: str | os.PathLike, platform_storage, sweeps_of, home_of, as_user, log):
        self.folder = Path(folder)
        self.platform_storage = platform_storage
        self.sweeps_of = sweeps_of
        self.home_of = home_of
        self.as_user = as_user
        self.log = log
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="trainhub-optuna-copies")
        self._dirty: dict[str, set[int]] = {}  # user -> sweeps whose study changed since their last refresh
        self._task: asyncio.Task | None = None
        self.refreshes = 0

    def changed(self, sweep: Sweep) -> None:
        """The study of ``sweep`` changed (a trial's outcome told, the sweep ended): its user's copy is refreshed
        soon (refreshes of one user coalesce while one runs)."""
        self._dirty.setdefault(sweep.user, set()).add(sweep.id)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def idle(self) -> None:
        """Wait until no refresh is due (tests, shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._dirty:
            user, ids = self._dirty.popitem()
            try:
                await loop.run_in_executor(self._pool, self.refresh, user, ids)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # one user's home never stops another's copy, nor the sweep
                self.log.warning("sweeps: the Optuna copy of %s's studies was not refreshed: %s", user, e)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- blocking, on this class's thread ----------------------------------------------------------------------
    def refresh(self, user: str, sweep_ids=()) -> str | None:
        """Bring ``user``'s copy up to date with the studies of ``sweep_ids`` (all of their sweeps when the platform's
        file of the copy is new) and write it into their home as them. Returns the path written, None when they have
        no home here yet."""
        home = self.home_of(user)
        if not home or not os.path.isdir(home):
            return None
        import optuna

        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        path = self.folder / copy_name(user)
        fresh = not path.exists()
        sweeps = {s.id: s for s in self.sweeps_of(user) if s.user == user}  # only this user's: by construction
        wanted = sorted(sweeps) if fresh else sorted(i for i in set(sweep_ids) if i in sweeps)
        storage = optuna.storages.RDBStorage(f"sqlite:///{path}", skip_table_creation=False)
        try:
            os.chmod(path, 0o600)
            names = {s.study_name for s in storage.get_all_studies()}
            for sid in wanted:
                self._copy_one(storage, names, sweeps[sid])
        finally:
            storage.remove_session()
            storage.engine.dispose()
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with self.as_user(user).tree(home) as tree:
                tree.copy_in(fd, OPTUNA_COPY, mode=0o600)
        finally:
            os.close(fd)
        self.refreshes += 1
        return os.path.join(home, OPTUNA_COPY)

    def _copy_one(self, storage, names: set, sweep: Sweep) -> None:
        """Bring the copy of one study up to date in place: its id and its trials' numbers stay what they were (an open
        dashboard page keeps working); new trials are added in number order, running ones updated."""
        from optuna.trial import TrialState

        key = sweep_key(sweep.id)
        source = self.platform_storage()
        try:
            source_id = source.get_study_id_from_name(study_name(sweep.id))
        except KeyError:  # a sweep whose study was never made (refused at creation): nothing to copy
            return
        if key in names:
            study_id = storage.get_study_id_from_name(key)
        else:
            study_id = storage.create_new_study(source.get_study_directions(source_id), key)
        attrs = {**source.get_study_user_attrs(source_id), "trainhub_name": sweep.name, "trainhub_metric": sweep.metric,
                 "trainhub_state": sweep.state, "trainhub_copy": "read-only copy: writing here changes nothing on the platform"}
        for k, v in attrs.items():
            storage.set_study_user_attr(study_id, k, v)
        have = storage.get_all_trials(study_id, deepcopy=False)
        for t in source.get_all_trials(source_id, deepcopy=False):
            if t.number >= len(have):
                storage.create_new_trial(study_id, template_trial=t)
                continue
            mine = have[t.number]
            if mine.state.is_finished() or (t.state == mine.state and t.intermediate_values == mine.intermediate_values):
                continue
            for step, value in t.intermediate_values.items():
                if mine.intermediate_values.get(step) != value:
                    storage.set_trial_intermediate_value(mine._trial_id, step, value)
            if t.state != TrialState.RUNNING:
                storage.set_trial_state_values(mine._trial_id, t.state, t.values)
