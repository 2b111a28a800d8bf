"""The one way tests wait: a condition with a deadline, never a fixed sleep, never a stopwatch.

Built on the core's :func:`trainhub.backoff.poll` / :func:`~trainhub.backoff.apoll`. On timeout
the test fails with an ``AssertionError`` naming what was awaited and the last value observed, so a
failure under load says what the test saw, not only that it gave up.

    job = wait_for(lambda: api.get(jid), lambda j: j["state"] == "running", what=f"job {jid} to run")
    pod = await await_for(lambda: kube.pod(name), what=f"pod {name}")       # fetch may be async

``done`` defaults to truthiness; the value that satisfied it is returned. ``interval`` is the pause
between looks (steady by default; pass ``factor``/``cap`` for a growing one).

"X must not happen" is checked by waiting for a later event that proves X would have happened by
then (a later pass of the loop that would do X, a later log line, a later state), then asserting X
did not: never by sleeping a guessed time.
"""

from __future__ import annotations

from typing import Any, Callable

from trainhub.backoff import WaitTimeout, apoll, poll

DEFAULT_TIMEOUT = 30.0


def _describe(value: Any) -> str:
    text = repr(value)
    return "last seen: " + (text if len(text) <= 2000 else text[:2000] + "...")


def wait_for(fetch: Callable[[], Any], done: Callable[[Any], bool] = bool, *, what: str,
             timeout: float = DEFAULT_TIMEOUT, interval: float = 0.2, factor: float = 1.0,
             cap: float | None = None, describe: Callable[[Any], str] | None = None) -> Any:
    """Call ``fetch()`` until ``done(value)``; return that value. AssertionError after ``timeout`` s."""
    try:
        return poll(fetch, done, what=what, describe=describe or _describe, start=interval, factor=factor, cap=cap,
                    timeout=timeout)
    except WaitTimeout as e:
        raise AssertionError(str(e)) from None


async def await_for(fetch: Callable[[], Any], done: Callable[[Any], bool] = bool, *, what: str,
                    timeout: float = DEFAULT_TIMEOUT, interval: float = 0.05, factor: float = 1.0,
                    cap: float | None = None, describe: Callable[[Any], str] | None = None) -> Any:
    """:func:`wait_for` without blocking the event loop; ``fetch`` may return an awaitable."""
    try:
        return await apoll(fetch, done, what=what, describe=describe or _describe, start=interval, factor=factor,
                           cap=cap, timeout=timeout)
    except WaitTimeout as e:
        raise AssertionError(str(e)) from None
