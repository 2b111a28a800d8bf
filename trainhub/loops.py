"""One periodic loop shape for every background worker of the services.

Run once at start, then every ``interval`` seconds (with jitter) or as soon as something
calls :meth:`PeriodicLoop.wake`; a failing pass is logged and retried next time, never
ends the loop; cancellation is re-raised.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Awaitable, Callable

from trainhub.backoff import wait_event


class PeriodicLoop:
    def __init__(self, name: str, body: Callable[[], Awaitable[None]], interval: Callable[[], float] | float,
                 log: logging.Logger, jitter: float = 0.0):
        self.name, self.body, self.log, self.jitter = name, body, log, jitter
        self._interval = interval
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def interval(self) -> float:
        value = self._interval() if callable(self._interval) else self._interval
        return max(float(value), 0.01) * (1 + random.uniform(0, self.jitter))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.body()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.log.exception("%s: pass failed; retrying in %.1f s", self.name, self.interval)
            await wait_event(self._wake, self.interval)
            self._wake.clear()
