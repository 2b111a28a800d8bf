"""GPU quotas per user and per group, counted over everything a user holds.

Notebook servers and jobs draw on the same ledger, so one check covers both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from traitlets import Dict, Integer
from traitlets.config import LoggingConfigurable

from trainhub.exceptions import QuotaExceeded


@dataclass
class QuotaStatus:
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


class QuotaPolicy(LoggingConfigurable):
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

    def limit_for(self, user: str) -> int | None:
        return self.user_gpu_limits.get(user, self.user_gpu_limit)

    def status(self, user: str, user_groups: Iterable[str], holdings: Mapping[str, int], members: Mapping[str, Iterable[str]]) -> QuotaStatus:
        """``holdings``: GPUs held per user; ``members``: group -> member names."""
        groups = {}
        for g in user_groups:
            if g in self.group_gpu_limits:
                held = sum(holdings.get(u, 0) for u in set(members.get(g, ())) | {user})
                groups[g] = {"held": held, "limit": int(self.group_gpu_limits[g])}
        return QuotaStatus(user=user, held=holdings.get(user, 0), limit=self.limit_for(user), groups=groups)

    def check(self, request: int, status: QuotaStatus) -> None:
        """Raise QuotaExceeded with the numbers when ``request`` more GPUs would pass a limit."""
        if request <= 0:
            return
        if status.limit is not None and status.held + request > status.limit:
            raise QuotaExceeded(
                f"GPU quota exceeded: {status.user} holds {status.held} of {status.limit} GPUs and asked for {request} more. "
                "Stop a server or job, or ask an admin to raise your quota.",
                held=status.held, limit=status.limit, requested=request,
            )
        for g, info in status.groups.items():
            if info["held"] + request > info["limit"]:
                raise QuotaExceeded(
                    f"Group GPU quota exceeded: group {g!r} holds {info['held']} of {info['limit']} GPUs and "
                    f"{status.user} asked for {request} more.",
                    group=g, held=info["held"], limit=info["limit"], requested=request,
                )
