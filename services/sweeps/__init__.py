"""Hyperparameter sweeps, served by the jobs service (a plugin listed in ``app.PLUGINS``).

``POST/GET {api}/sweeps``, ``GET/DELETE {api}/sweeps/{id}``, ``GET {api}/sweeps/{id}/trials``
(handlers.py); the :class:`~.controller.SweepController` loop runs every trial as a job of the
service and lets Optuna (its RDB storage in the platform database) sample and prune. Search
spaces: :mod:`.space`. Importing this package loads nothing heavy: the kernel's ``%%sweep``
and the CLI use :mod:`.space` and :mod:`.spec` without a service.
"""

from __future__ import annotations

from pathlib import Path

OPENAPI = Path(__file__).with_name("openapi.json")


def routes(prefix: str, service) -> list:
    from .handlers import default_handlers

    return default_handlers(prefix, service)


async def start(service) -> None:
    """Create the controller (``service.sweeps``) and start its loop."""
    from .controller import SweepController

    service.sweeps = SweepController(service, parent=service)
    await service.sweeps.start()


def workdirs_in_use(service, user: str) -> set[str]:
    """The working directories ``user``'s running sweeps start their trials in (blocking: on a reader thread)."""
    controller = getattr(service, "sweeps", None)
    return set() if controller is None else controller.store.workdirs_in_use(user)


async def stop(service) -> None:
    controller = getattr(service, "sweeps", None)
    if controller is not None:
        await controller.stop()
