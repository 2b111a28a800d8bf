"""What the culler sees of a GPU server besides its GPUs: its kernels, its own activity, who is connected, GPU work
outside the notebooks, and its user's running jobs. A mixin of :class:`~trainhub.services.culler.service.GPUCuller`;
an answer it cannot get is ``None`` (unknown), which the policy never reads as idle.
"""

from __future__ import annotations

from datetime import datetime, timezone

from trainhub.fmt import as_utc

# As jupyter-server's own kernel culler (cull_busy): only "busy" means a cell is executing. A kernel
# started over REST and never connected stays "starting" for ever, so that state cannot count.
BUSY_KERNEL_STATES = {"busy"}


def parse_date(value: str | None) -> datetime | None:
    if not value:
        return None
    return as_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))  # naive = UTC, as the idle culler assumes


class ObserveMixin:
    async def _kernel_state(self, server_model) -> tuple[bool | None, int, datetime | None, int | None]:
        """(any kernel busy, kernel count, latest kernel activity, open kernel websockets); None = unknown."""
        try:
            kernels = await self.client.kernels(server_model.get("url") or "")
        except Exception as e:
            self.prom.errors.labels("kernels").inc()
            self.log.warning("kernels API of %s did not answer: %s", server_model.get("url"), e)
            return None, 0, None, None
        busy = any(k.get("execution_state") in BUSY_KERNEL_STATES for k in kernels)
        activity = [parse_date(k.get("last_activity")) for k in kernels]
        activity = [a for a in activity if a]
        connections = sum(int(k.get("connections") or 0) for k in kernels)
        return busy, len(kernels), max(activity) if activity else None, connections

    async def _last_request(self, server_model) -> datetime | None:
        """The server's own last_activity (API requests, kernels, terminals); None = unknown."""
        try:
            status = await self.client.status(server_model.get("url") or "")
            return parse_date(status.get("last_activity"))
        except Exception as e:
            self.prom.errors.labels("status").inc()
            self.log.warning("status API of %s did not answer: %s", server_model.get("url"), e)
            return None

    def _last_seen(self, holder: str, connections: int | None, last_request: datetime | None,
                   now: datetime) -> datetime | None:
        """When someone was last at the server: a connection seen by a pass, or the server's own activity.

        The clock starts no earlier than this process first saw the server (after a restart
        it cannot know how long nobody was connected), so ``away_timeout`` errs late.
        """
        if connections is None or last_request is None:
            return None
        if connections > 0 or holder not in self.seen_at:
            self.seen_at[holder] = now
        return max(self.seen_at[holder], last_request)

    def _note_external_use(self, holder: str, devices: tuple[int, ...]) -> None:
        """No kernel executes now: a latest sample at or over the threshold is GPU work outside the notebooks
        (a terminal, a script). Its time feeds CullPolicy.external_use_timeout."""
        thr = self.policy.utilization_threshold
        busy = [s[0] for s in (self.history.latest(d) for d in devices) if s is not None and s[1] >= thr]
        if busy:
            at = datetime.fromtimestamp(max(busy), timezone.utc)
            if holder not in self.external_use_at or at > self.external_use_at[holder]:
                self.external_use_at[holder] = at

    async def _running_jobs(self, user: str) -> int | None:
        try:
            n = await self.client.running_jobs(user)
        except Exception as e:
            self.prom.errors.labels("jobs").inc()
            self.log.warning("jobs service did not answer for %s (treated as unknown: not culling): %s", user, e)
            return None
        return 0 if n is None else n
