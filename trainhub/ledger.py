"""The GPU ledger: which device is held by which notebook server or job, since when.

Allocation is a swappable component (``GPUAllocator``); the local back end keeps the
ledger in the platform database, the Kubernetes back end derives it from cluster state.
A device is never handed to two holders: on the local back end the device index is the
table's primary key and every allocation runs under the database write lock.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable, Mapping

from sqlalchemy import delete, insert, select, update
from traitlets import Instance, List, Unicode
from traitlets.config import LoggingConfigurable

from trainhub.db import SQLiteReader, get_engine, init_db, write_connection
from trainhub.exceptions import InvalidRequest, NoFreeGPUs
from trainhub.gpus import GPUDevice
from trainhub.models import GPUAllocation, GPUAllocationRecord, utcnow
from trainhub.quotas import Demand, QuotaPolicy, QuotaStatus


@dataclass(frozen=True)
class Holding:
    device: int
    holder: str
    kind: str
    user: str
    profile: str | None
    since: datetime
    pid: int | None = None
    pid_started: float | None = None

    def to_dict(self) -> dict:
        return {
            "device": self.device, "holder": self.holder, "kind": self.kind, "user": self.user,
            "profile": self.profile, "since": self.since.isoformat(), "pid": self.pid,
        }


def server_holder(user: str, server_name: str = "") -> str:
    return f"server:{user}/{server_name}"


def job_holder(job_id) -> str:
    return f"job:{job_id}"


def process_start_time(pid: int) -> float | None:
    """Start time of a process (seconds since boot, from /proc), to tell a live pid from a reused one."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int | None, started: float | None) -> bool:
    if not pid:
        return False
    now_started = process_start_time(pid)
    if now_started is None:
        return False
    return started is None or abs(now_started - started) < 1.0


class GPUAllocator(LoggingConfigurable):
    """Contract for GPU allocation; one instance per process.

    Implementations must make ``allocate`` atomic with its quota check across every
    process that allocates (hub, jobs service), never hand a device to two holders,
    and make ``release`` idempotent.
    """

    #: :meth:`holdings` is a small read that never waits (a local SQLite database in WAL mode): the jobs
    #: engine may make it on its event loop instead of a trip to a worker thread
    inline_reads = False

    def devices(self) -> list[GPUDevice]:
        """All devices in the pool."""
        raise NotImplementedError

    def allocate(
        self, holder: str, *, kind: str, user: str, count: int, profile: str | None = None,
        gpu_model: str | None = None, quota: QuotaPolicy | None = None,
        user_groups: Iterable[str] = (), group_members: Mapping[str, Iterable[str]] | None = None,
        per_worker: int | None = None,
    ) -> list[int]:
        """Take ``count`` devices for ``holder`` or raise NoFreeGPUs / QuotaExceeded; nothing is held on error.

        ``quota``: admit the request with ``QuotaPolicy.admit`` against the holdings read under the
        same lock as the allocation, so two holders can never both pass a quota.

        ``per_worker``: a gang's GPUs per worker, for back ends with several nodes (each worker's
        devices must sit on one node); one machine ignores it.
        """
        raise NotImplementedError

    def release(self, holder: str) -> list[int]:
        """Give back everything ``holder`` holds; returns the devices freed."""
        raise NotImplementedError

    def holdings(self) -> list[Holding]:
        raise NotImplementedError

    def set_pid(self, holder: str, pid: int) -> None:
        """Record the process that uses the holder's devices (for crash reconciliation)."""

    def start(self) -> None:
        """Warm up before first use (cluster-state ledgers start their watch caches). Default: nothing."""

    def close(self) -> None:
        """Release caches and connections; the allocator is not used afterwards. Default: nothing."""

    def gpu_targets(self, devices: list[int]) -> dict:
        """Ledger devices -> where a per-pod metrics source finds them (``trainhub.metrics.prometheus.GPUTarget``).
        Default: {} (the devices are this machine's)."""
        return {}

    def reconcile(self, is_alive: Callable[[Holding], bool]) -> list[Holding]:
        """Release holdings whose holder is gone; returns what was released."""
        raise NotImplementedError

    def free_devices(self, gpu_model: str | None = None) -> list[GPUDevice]:
        held = {h.device for h in self.holdings()}
        return [d for d in self.devices() if d.index not in held and _model_ok(d, gpu_model)]

    def quota_status(self, user: str, quota: QuotaPolicy, user_groups: Iterable[str] = (), group_members=None) -> QuotaStatus:
        per_user = Counter(h.user for h in self.holdings())
        return quota.status(user, user_groups, per_user, group_members or {})


_HELD, _HISTORY = GPUAllocation.__table__, GPUAllocationRecord.__table__


def _close_history(conn, holders) -> None:
    conn.execute(update(_HISTORY).where(_HISTORY.c.holder.in_(list(holders)), _HISTORY.c.end.is_(None)).values(end=utcnow()))


def _model_ok(device: GPUDevice, gpu_model: str | None) -> bool:
    return not gpu_model or gpu_model.lower() in device.name.lower()


_HOLDINGS = select(GPUAllocation.device, GPUAllocation.holder, GPUAllocation.kind, GPUAllocation.user, GPUAllocation.profile,
                   GPUAllocation.since, GPUAllocation.pid, GPUAllocation.pid_started).order_by(GPUAllocation.device)


class LocalGPUAllocator(GPUAllocator):
    """The ledger in the platform database (SQLite in the data dir by default)."""

    db_url = Unicode(help="SQLAlchemy URL of the platform database holding the ledger.").tag(config=True)
    device_list = List(help="The pool's devices as dicts (GPUDevice fields); written by `trainhub up`.").tag(config=True)
    _devices = Instance(list, allow_none=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if not self.db_url:
            raise ValueError("LocalGPUAllocator.db_url is required")
        init_db(self.db_url)
        self._reader = SQLiteReader.for_engine(get_engine(self.db_url))
        self.inline_reads = self._reader is not None

    def devices(self) -> list[GPUDevice]:
        if self._devices is None:
            self._devices = [GPUDevice(**d) for d in self.device_list]
        return self._devices

    def allocate(self, holder, *, kind, user, count, profile=None, gpu_model=None, quota=None, user_groups=(), group_members=None,
                 per_worker=None):
        if count < 0:
            raise InvalidRequest(f"GPU count must be 0 or more, not {count}")
        pool = [d for d in self.devices() if _model_ok(d, gpu_model)]
        # Core statements on the write transaction (write_connection): every job's start and end passes here
        with write_connection(self.db_url) as c:
            # re-allocation for the same holder (a restart after a crash) replaces what it had
            _close_history(c, [holder])
            c.execute(delete(_HELD).where(_HELD.c.holder == holder))
            if count == 0:
                return []
            rows = c.execute(select(_HELD.c.device, _HELD.c.user)).all()
            if quota is not None:  # admission, atomic with the allocation (same write lock)
                per_user = Counter(r.user for r in rows)
                quota.admit(Demand(user, tuple(user_groups), 1, count, kind),
                            quota.status(user, user_groups, per_user, group_members or {}))
            held = {r.device for r in rows}
            free = [d.index for d in pool if d.index not in held]
            if len(free) < count:
                what = f"{gpu_model} GPUs" if gpu_model else "GPUs"
                if len(pool) < count:
                    raise NoFreeGPUs(
                        f"Asked for {count} {what} but this platform has only {len(pool)}.",
                        requested=count, free=len(free), total=len(pool),
                    )
                raise NoFreeGPUs(
                    f"Not enough free {what}: asked for {count}, {len(free)} of {len(pool)} free. "
                    "Try again when a server or job stops, or pick a smaller profile.",
                    requested=count, free=len(free), total=len(pool),
                )
            chosen = free[:count]
            now = utcnow()
            common = {"holder": holder, "kind": kind, "user": user, "profile": profile}
            c.execute(insert(_HELD), [{"device": i, "since": now, **common} for i in chosen])
            c.execute(insert(_HISTORY), [{"device": i, "start": now, **common} for i in chosen])
        self.log.info("GPU allocate holder=%s user=%s devices=%s", holder, user, chosen)
        return chosen

    def release(self, holder):
        with write_connection(self.db_url) as c:
            devices = list(c.execute(select(_HELD.c.device).where(_HELD.c.holder == holder)).scalars())
            _close_history(c, [holder])
            c.execute(delete(_HELD).where(_HELD.c.holder == holder))
        if devices:
            self.log.info("GPU release holder=%s devices=%s", holder, devices)
        return devices

    def holdings(self):
        # Core rows, not ORM instances (through SQLiteReader on SQLite): every scheduling pass of the jobs engine reads this
        if self._reader is not None:
            return [Holding(*r) for r in self._reader.rows(_HOLDINGS)]
        with get_engine(self.db_url).connect() as c:
            return [Holding(*r) for r in c.execute(_HOLDINGS)]

    def set_pid(self, holder, pid):
        started = process_start_time(pid)
        with write_connection(self.db_url) as c:
            c.execute(update(_HELD).where(_HELD.c.holder == holder).values(pid=pid, pid_started=started))

    def reconcile(self, is_alive):
        released = []
        for h in self.holdings():
            if not is_alive(h):
                released.append(h)
        if released:
            holders = {h.holder for h in released}
            with write_connection(self.db_url) as c:
                _close_history(c, holders)
                c.execute(delete(_HELD).where(_HELD.c.holder.in_(holders)))
            for holder in sorted(holders):
                self.log.warning("GPU reconcile: released devices of %s (holder is gone)", holder)
        return released
