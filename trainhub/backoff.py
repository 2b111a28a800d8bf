"""One backoff primitive for every wait loop: sync (``time.sleep``) and async (``asyncio.sleep``).

A wait loop asks "is it done yet?", pauses, and asks again, until the answer is yes or a deadline
passes. :class:`Backoff` is the pause: it starts at ``start`` seconds, grows by ``factor`` after
each pause up to ``cap``, is spread by ``jitter`` (a fraction: 0.1 = ±10 %) so many waiters do not
ask in step, is trimmed so the last question is asked at the deadline, and then raises
:class:`WaitTimeout` (a ``TimeoutError``) naming what was waited for. :func:`poll` and
:func:`apoll` are the loop itself: fetch a value until ``done(value)``.

jupyterhub's ``utils.exponential_backoff`` is async only; the client, the CLI and the kernel
side are synchronous, so the platform has this one. The Kubernetes launcher's API retries use it
too; the watch caches are kubespawner's reflector (:mod:`trainhub.kube.reflector`).

    job = poll(lambda: client.get(job_id), lambda j: j["state"] in JOB_TERMINAL,
               what=f"job {job_id} to end", start=1.0, factor=1.0, timeout=600)
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from typing import Any, Callable


async def within(awaitable, timeout: float | None):
    """``await awaitable`` for at most ``timeout`` seconds (TimeoutError after that). Every bounded await of the
    services goes through here, not ``asyncio.wait_for``: on Python 3.11 that swallows a cancellation which comes as
    the awaited thing finishes, so a cancelled loop goes round again (and a service's stop waits for it forever)."""
    async with asyncio.timeout(timeout):
        return await awaitable


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set (True) or ``timeout`` seconds pass (False); see :func:`within`."""
    try:
        await within(event.wait(), timeout)
        return True
    except TimeoutError:
        return event.is_set()


class WaitTimeout(TimeoutError):
    """The deadline of a wait passed. ``last`` is the last value fetched (None if none was)."""

    def __init__(self, message: str, last: Any = None):
        super().__init__(message)
        self.last = last


class Backoff:
    """The pauses of one wait loop.

    ``what``: what is waited for, for the timeout message ("job j-000042 to end").
    ``start``: the first pause (seconds); ``factor``: each pause is the previous times this
    (1 = a steady interval); ``cap``: the longest pause (None = no cap); ``jitter``: each pause is
    spread by up to this fraction either way (0 = exact); ``timeout``: seconds from now until
    :meth:`next_delay` raises :class:`WaitTimeout` (None = wait for ever).
    """

    def __init__(self, what: str = "a condition", *, start: float = 0.1, factor: float = 2.0, cap: float | None = 5.0,
                 jitter: float = 0.0, timeout: float | None = None, clock: Callable[[], float] = time.monotonic,
                 rng: Callable[[], float] = random.random):
        if start < 0 or factor < 1 or (cap is not None and cap < 0) or not 0 <= jitter < 1 or (timeout is not None and timeout < 0):
            raise ValueError(f"Backoff({what!r}): need start >= 0, factor >= 1, cap >= 0, 0 <= jitter < 1, timeout >= 0")
        self.what = what
        self.start = start
        self.factor = factor
        self.cap = cap
        self.jitter = jitter
        self.timeout = timeout
        self._clock = clock
        self._rng = rng
        self.deadline = None if timeout is None else clock() + timeout
        self._next = start
        self.last: Any = None  # what the loop saw last (poll() keeps it for the timeout message)

    def reset(self) -> None:
        """Start again from the first pause (after a success in a loop that backs off on errors)."""
        self._next = self.start

    @property
    def remaining(self) -> float | None:
        """Seconds to the deadline (None without one; 0 once it has passed)."""
        return None if self.deadline is None else max(0.0, self.deadline - self._clock())

    @property
    def expired(self) -> bool:
        return self.deadline is not None and self._clock() >= self.deadline

    def timeout_error(self, detail: str = "") -> WaitTimeout:
        return WaitTimeout(f"timed out after {self.timeout:g}s waiting for {self.what}" + (f" ({detail})" if detail else ""),
                           self.last)

    def next_delay(self) -> float:
        """The next pause in seconds; :class:`WaitTimeout` once the deadline has passed."""
        remaining = self.remaining
        if remaining is not None and remaining <= 0:
            raise self.timeout_error()
        delay = self._next if self.cap is None else min(self._next, self.cap)
        self._next = delay * self.factor
        if self.jitter:
            delay *= 1 + self.jitter * (2 * self._rng() - 1)
        return delay if remaining is None else min(delay, remaining)

    def sleep(self, until: threading.Event | None = None) -> bool:
        """Pause (blocking). With ``until``, return True as soon as that event is set (False after a full pause)."""
        delay = self.next_delay()
        if until is not None:
            return until.wait(delay)
        time.sleep(delay)
        return False

    async def asleep(self, until: asyncio.Event | None = None) -> bool:
        """Pause without blocking the event loop; with ``until``, return True as soon as it is set."""
        delay = self.next_delay()
        if until is None:
            await asyncio.sleep(delay)
            return False
        return await wait_event(until, delay)


def poll(fetch: Callable[[], Any], done: Callable[[Any], bool] = bool, *, what: str,
         describe: Callable[[Any], str] | None = None, **backoff) -> Any:
    """Call ``fetch()`` until ``done(value)``, pausing as :class:`Backoff` (``start``, ``factor``, ``cap``,
    ``jitter``, ``timeout``) says; return that value. On timeout :class:`WaitTimeout` says what was
    waited for and, with ``describe``, how the last value looked; its ``last`` is that value."""
    pause = Backoff(what, **backoff)
    while True:
        pause.last = value = fetch()
        if done(value):
            return value
        try:
            pause.sleep()
        except WaitTimeout:
            raise pause.timeout_error(describe(value) if describe else "") from None


async def apoll(fetch: Callable[[], Any], done: Callable[[Any], bool] = bool, *, what: str,
                describe: Callable[[Any], str] | None = None, **backoff) -> Any:
    """:func:`poll` for coroutines: ``fetch`` may be async; pauses with ``asyncio.sleep``."""
    pause = Backoff(what, **backoff)
    while True:
        value = fetch()
        if inspect.isawaitable(value):
            value = await value
        pause.last = value
        if done(value):
            return value
        try:
            await pause.asleep()
        except WaitTimeout:
            raise pause.timeout_error(describe(value) if describe else "") from None
