"""Spawner refusals as JupyterHub's ``SpawnException``.

A refused spawn (unknown profile 400, profile of another group or over quota 403, no free
GPUs 409) reaches the REST API caller and the spawn page with the domain error's message;
the hub's log gets the error's kind and numbers beside it; its spawn metrics count it as a
``failure`` labelled with the error's ``reason`` ("profile", "quota", "capacity", ...), never as
an ``error`` of the platform, and the hub's consecutive-failure counter is left alone.
"""

from __future__ import annotations

from jupyterhub.spawner import SpawnException

from trainhub.exceptions import TrainhubError


def spawn_refusal(error: TrainhubError) -> SpawnException:
    """The SpawnException for a refusal: ``error.message`` to the user, details to the log."""
    details = ", ".join(f"{k}={v!r}" for k, v in error.details.items())
    exc = SpawnException(
        error.message,
        reason=error.reason,
        status_code=error.status_code,
        log_message=f"{type(error).__name__}({details}): {error.message}",
    )
    # what the spawn form and spawn-pending pages show (they would print str(exc) otherwise)
    exc.jupyterhub_message = error.message
    return exc


def spawn_failure(user: str, error: BaseException) -> SpawnException:
    """A start that failed on the platform's side (a home that cannot be prepared, a server that exits at once, the
    network gate or the storage credentials unavailable): the user and the REST API caller read what happened instead
    of a bare "500 Internal Server Error"; the hub's log has the traceback."""
    what = str(error) or type(error).__name__
    message = f"The server of {user} could not start: {what}"
    exc = SpawnException(message, status_code=500, reason="platform", log_message=f"{type(error).__name__}: {error}")
    exc.jupyterhub_message = message
    return exc
