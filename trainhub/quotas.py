"""Admission: what a user may hold at once, decided in one place for servers, jobs and sweep trials.

Two resources are limited per user:

* **GPUs**, counted over everything a user holds: notebook servers, running jobs and trials
  alike (they draw on the same ledger). Per user (``user_gpu_limit``, ``user_gpu_limits``) and
  per JupyterHub group, all members together (``group_gpu_limits``).
* **CPU-only worker processes**: the workers of running jobs and trials that hold no GPU
  (``user_cpu_worker_limit``, ``user_cpu_worker_limits``). GPU jobs are bounded by their GPUs
  instead; a notebook server is one process and is not counted here (JupyterHub's
  ``named_server_limit_per_user`` bounds those).

The rule lives in :class:`Quotas` (pure numbers, no configuration machinery) and is applied two
ways, with one text for each outcome:

* **with what is held now** (the ledger's atomic ``allocate`` for servers and job launches, the
  spawners' prechecks, the scheduler's queue): ``held + asked > limit`` refuses;
* **without it** (a job or sweep submission): ``asked > limit`` refuses, because such a request
  could never start; anything smaller is queued and the scheduler holds it to the quota.

:meth:`QuotaPolicy.admit` raises :class:`~trainhub.exceptions.QuotaExceeded` (HTTP 403) with
:attr:`Refusal.message`; the scheduler shows :attr:`Refusal.wait_message` for a queued job.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from traitlets import Dict, Integer, default
from traitlets.config import LoggingConfigurable

from trainhub.exceptions import QuotaExceeded

_EMPTY: Mapping[str, int] = MappingProxyType({})

#: What a refusal names as the thing asking, by kind of request.
WHAT = {"job": "this job", "trial": "each trial", "server": "this server"}


@dataclass(frozen=True)
class Demand:
    """What a request asks for: ``workers`` of ``gpus_per_worker`` GPUs each (0 = CPU only).

    ``kind`` ("job", "trial" or "server") only changes how the messages name it.
    """

    user: str
    groups: tuple[str, ...] = ()
    workers: int = 1
    gpus_per_worker: int = 0
    kind: str = "job"

    @classmethod
    def server(cls, user: str, groups: Iterable[str], gpus: int) -> "Demand":
        return cls(user, tuple(groups), 1, gpus, "server")

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker if self.gpus_per_worker > 0 else 0

    @property
    def cpu_workers(self) -> int:
        """Worker processes without a GPU (a server is not counted: see the module docstring)."""
        return self.workers if self.gpus_per_worker <= 0 and self.kind != "server" else 0

    @property
    def what(self) -> str:
        return WHAT.get(self.kind, "this job")

    def gpu_detail(self) -> str:
        return "" if self.kind == "server" else f" ({self.workers} worker(s) × {self.gpus_per_worker})"


@dataclass(frozen=True)
class Refusal:
    """Why a request is over a quota, with the numbers; ``held=None``: judged without holdings."""

    code: str  # "quota-user", "quota-group" or "quota-cpu" (the scheduler's wait codes)
    user: str
    need: int
    limit: int
    held: int | None = None
    group: str | None = None
    what: str = "this job"
    detail: str = ""

    @property
    def message(self) -> str:
        """The 403 text: which limit, the numbers, and what to do."""
        if self.code == "quota-user":
            if self.held is None:
                return (f"GPU quota exceeded: {self.what} needs {self.need} GPUs{self.detail} but your quota is "
                        f"{self.limit}. Ask for fewer GPUs, or ask an admin to raise your quota.")
            return (f"GPU quota exceeded: {self.user} holds {self.held} of {self.limit} GPUs and asked for "
                    f"{self.need} more. Stop a server or job, or ask an admin to raise your quota.")
        if self.code == "quota-group":
            if self.held is None:
                return (f"Group GPU quota exceeded: {self.what} needs {self.need} GPUs but group {self.group!r} "
                        f"may hold at most {self.limit}. Ask for fewer GPUs, or ask an admin to raise the group's quota.")
            return (f"Group GPU quota exceeded: group {self.group!r} holds {self.held} of {self.limit} GPUs and "
                    f"{self.user} asked for {self.need} more. Wait until a server or job of the group stops, "
                    "or ask an admin to raise the group's quota.")
        if self.held is None:
            return (f"CPU quota exceeded: {self.what} needs {self.need} CPU-only worker processes but your quota is "
                    f"{self.limit}. Ask for fewer workers, or ask an admin to raise your quota.")
        return (f"CPU quota exceeded: {self.user} runs {self.held} of {self.limit} CPU-only worker processes and "
                f"asked for {self.need} more. Wait until a job ends, or ask an admin to raise your quota.")

    @property
    def wait_message(self) -> str:
        """The text for a queued job that waits for this quota (the scheduler's reason)."""
        held = self.held or 0
        if self.code == "quota-user":
            return f"over quota: {self.user} holds {held} of {self.limit} GPUs and {self.what} needs {self.need}"
        if self.code == "quota-group":
            return f"over group quota: {self.group} holds {held} of {self.limit} GPUs and {self.what} needs {self.need}"
        return (f"over CPU quota: {self.user} runs {held} of {self.limit} CPU-only workers and "
                f"{self.what} needs {self.need}")

    def error(self) -> QuotaExceeded:
        details = dict(code=self.code, user=self.user, held=self.held, limit=self.limit, requested=self.need)
        if self.group is not None:
            details["group"] = self.group
        return QuotaExceeded(self.message, **details)


@dataclass(frozen=True)
class Quotas:
    """The limits of a :class:`QuotaPolicy` as plain numbers, and the rule. ``None`` = unlimited.

    This is also the scheduler's quota view (it keeps GPUs held per user and group itself and asks
    :meth:`gpu_refusal` / :meth:`cpu_refusal`), so the queue and the 403s apply the same rule.
    """

    user_default: int | None = None
    users: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    groups: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    cpu_default: int | None = None
    cpu_users: Mapping[str, int] = field(default_factory=lambda: _EMPTY)

    def user_limit(self, user: str) -> int | None:
        """The most GPUs ``user`` may hold at once (override first, then the default)."""
        return self.users.get(user, self.user_default)

    def cpu_limit(self, user: str) -> int | None:
        """The most CPU-only worker processes ``user`` may run at once."""
        return self.cpu_users.get(user, self.cpu_default)

    def gpu_refusal(self, user: str, groups: Iterable[str], need: int, held: int | None = None,
                    group_held: Mapping[str, int] | None = None, *, what: str = "this job",
                    detail: str = "") -> Refusal | None:
        """``need`` more GPUs for ``user``: the first limit it breaks, else None.

        ``held``/``group_held``: GPUs held now by the user / by each group's members; ``held=None``
        judges the request alone (could it ever start?).
        """
        if need <= 0:
            return None
        limit = self.user_limit(user)
        if limit is not None and (held or 0) + need > limit:
            return Refusal("quota-user", user, need, limit, held, what=what, detail=detail)
        caps = self.groups
        if caps:
            for grp in groups:
                cap = caps.get(grp)
                if cap is None:
                    continue
                g_held = None if held is None else (group_held or {}).get(grp, 0)
                if (g_held or 0) + need > cap:
                    return Refusal("quota-group", user, need, cap, g_held, group=grp, what=what, detail=detail)
        return None

    def cpu_refusal(self, user: str, need: int, held: int | None = None, *, what: str = "this job") -> Refusal | None:
        """``need`` more CPU-only worker processes for ``user`` (``held``: running now; None = ignore)."""
        if need <= 0:
            return None
        limit = self.cpu_limit(user)
        if limit is not None and (held or 0) + need > limit:
            return Refusal("quota-cpu", user, need, limit, held, what=what)
        return None

    def refusal(self, demand: Demand, usage: "QuotaStatus | None" = None) -> Refusal | None:
        """The first limit ``demand`` breaks, GPUs first. ``usage``: GPUs held now (None = judge the request alone).

        CPU-only workers are judged alone here; the scheduler holds queued jobs to the running ones.
        """
        held = group_held = None
        if usage is not None:
            held = usage.held
            group_held = {g: info["held"] for g, info in usage.groups.items()}
        return (self.gpu_refusal(demand.user, demand.groups, demand.gpus, held, group_held,
                                 what=demand.what, detail=demand.gpu_detail())
                or self.cpu_refusal(demand.user, demand.cpu_workers, what=demand.what))


@dataclass
class QuotaStatus:
    """GPUs a user and their capped groups hold now, with the limits (the spawn page shows it)."""

    user: str
    held: int
    limit: int | None
    groups: dict  # group -> {"held": n, "limit": m}

    @property
    def remaining(self) -> int | None:
        """GPUs this user may still take, the tightest of the user's and groups' limits."""
        rem = None if self.limit is None else max(self.limit - self.held, 0)
        for g in self.groups.values():
            if g["limit"] is not None:
                r = max(g["limit"] - g["held"], 0)
                rem = r if rem is None else min(rem, r)
        return rem

    def to_dict(self) -> dict:
        return {"user": self.user, "held": self.held, "limit": self.limit, "remaining": self.remaining, "groups": self.groups}


def machine_cores() -> int:
    """CPU cores this process may use (its affinity set, so a container's cpuset counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class QuotaPolicy(LoggingConfigurable):
    """The admission policy (configured as ``c.QuotaPolicy``); :meth:`admit` is the one check."""

    user_gpu_limit = Integer(
        None,
        allow_none=True,
        help="GPUs one user may hold at once across notebook servers and running jobs. None = unlimited (the pool size still applies).",
    ).tag(config=True)

    user_gpu_limits = Dict(
        {},
        help='Per-user overrides of user_gpu_limit, e.g. {"alice": 4}.',
    ).tag(config=True)

    group_gpu_limits = Dict(
        {},
        help='Caps on the GPUs all members of a JupyterHub group hold together, e.g. {"students": 2}. Groups not listed are uncapped.',
    ).tag(config=True)

    user_cpu_worker_limit = Integer(
        allow_none=True,
        help="""CPU-only worker processes one user may run at once: the workers of running jobs and
        sweep trials that hold no GPU, e.g. 8. A job with more workers than this is refused (403);
        smaller ones wait in the queue while the user's other CPU-only jobs use the quota.
        Default: the cores of the machine running the jobs service, at least 4.
        None = unlimited (only Scheduler.max_cpu_jobs then bounds CPU-only work).""",
    ).tag(config=True)

    user_cpu_worker_limits = Dict(
        {},
        help='Per-user overrides of user_cpu_worker_limit, e.g. {"alice": 32}.',
    ).tag(config=True)

    @default("user_cpu_worker_limit")
    def _default_cpu_workers(self):
        return max(4, machine_cores())

    def limit_for(self, user: str) -> int | None:
        return self.quotas().user_limit(user)

    def quotas(self) -> Quotas:
        """The limits as plain numbers (for the rule, and for the scheduler's pure policy)."""
        return Quotas(
            user_default=self.user_gpu_limit,
            users={u: int(n) for u, n in self.user_gpu_limits.items()},
            groups={g: int(n) for g, n in self.group_gpu_limits.items()},
            cpu_default=self.user_cpu_worker_limit,
            cpu_users={u: int(n) for u, n in self.user_cpu_worker_limits.items()},
        )

    def status(self, user: str, user_groups: Iterable[str], holdings: Mapping[str, int], members: Mapping[str, Iterable[str]]) -> QuotaStatus:
        """``holdings``: GPUs held per user; ``members``: group -> member names."""
        groups = {}
        for g in user_groups:
            if g in self.group_gpu_limits:
                held = sum(holdings.get(u, 0) for u in set(members.get(g, ())) | {user})
                groups[g] = {"held": held, "limit": int(self.group_gpu_limits[g])}
        return QuotaStatus(user=user, held=holdings.get(user, 0), limit=self.limit_for(user), groups=groups)

    def admit(self, demand: Demand, usage: QuotaStatus | None = None) -> None:
        """Admission for a server, a job or a sweep trial: raise QuotaExceeded (403) naming the limit.

        ``usage`` (from :meth:`status`): what the user and their groups hold now, for a request that
        takes GPUs at once (a server; a job's launch under the ledger's lock). Without it the request
        is judged alone, as at submission: only one that could never start is refused.
        """
        refusal = self.quotas().refusal(demand, usage)
        if refusal is not None:
            raise refusal.error()
