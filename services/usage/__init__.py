"""GPU efficiency: usage accounting and the input-bound job advisor (a jobs-service plugin).

- :mod:`.accounting` — pure GPU-seconds accounting over a timeline, report shapes, Prometheus text
- :mod:`.advisor` — pure diagnoses (input-bound, stalled, memory-bound, straggler) and thresholds
- :mod:`.procsample` — CPU and I/O wait of workers' process trees from /proc
- :mod:`.sampler` — the loop in the jobs service that samples, accounts and diagnoses
- :mod:`.handlers` — ``/usage``, ``/usage/metrics``, ``/jobs/{id}/diagnosis``

Loaded by ``trainhub.services.jobs.app`` (``PLUGINS``). See docs/usage.md.
"""

from __future__ import annotations

from pathlib import Path

OPENAPI = Path(__file__).with_name("openapi.json")


def routes(prefix: str, service) -> list:
    from .handlers import handlers as _handlers

    return _handlers(prefix, service)


async def start(service) -> None:
    from .sampler import UsageSampler

    sampler = UsageSampler(
        db_url=service.db_url, allocator=service.allocator, metrics_source=service.engine.metrics_source,
        store=service.store, groups_of=service.groups, parent=service,
    )
    service.usage_sampler = sampler
    await sampler.start()
    service.log.info("usage accounting every %gs (advisor %s)", sampler.sample_interval, "on" if sampler.advisor else "off")


async def stop(service) -> None:
    sampler = getattr(service, "usage_sampler", None)
    if sampler is not None:
        await sampler.stop()
