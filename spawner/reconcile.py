"""The hub's ledger reconciler: devices come back from servers that are gone.

A release can fail (the ledger's database locked) and the hub can crash between allocating devices and starting
the server: a loop in the hub frees, every poll interval, the holdings whose server process is gone, except those
this hub is starting right now and those granted in the server queue that wait for their restart.
"""

from __future__ import annotations

import asyncio

from trainhub.ledger import GPUAllocator, Holding, pid_alive
from trainhub.loops import PeriodicLoop
from trainhub.serverqueue import ServerQueue

# holders whose server this hub is starting right now (allocated, no process recorded yet)
starting_holders: set[str] = set()
# one ledger reconciler per allocator class in the hub process (see LocalGPUSpawner._ensure_reconciler)
_reconcilers: dict[str, PeriodicLoop] = {}
# the server queue of each ledger database, for the reconciler's look at granted requests
_queues: dict[str, ServerQueue] = {}


def server_alive(h: Holding) -> bool:
    """A server holding is live while its process lives, or while this hub is starting it; job
    holdings are the jobs service's to reconcile."""
    if h.kind != "server":
        return True
    if h.pid:
        return pid_alive(h.pid, h.pid_started)
    return h.holder in starting_holders


def reserved_holders(allocator: GPUAllocator) -> set[str]:
    """Servers whose GPUs were granted in the queue and wait, with no process yet, for the server's restart
    on a GPU profile (the culler's "get a GPU again"): not gone, whatever their ledger rows say."""
    db_url = getattr(allocator, "db_url", "")
    if not db_url:
        return set()
    queue = _queues.get(db_url)
    if queue is None:
        queue = _queues[db_url] = ServerQueue(db_url)  # creates the table once, under the write lock
    return queue.granted_holders()


def start_ledger_reconciler(allocator: GPUAllocator, interval, log) -> PeriodicLoop:
    """The hub's loop that frees, every ``interval()`` seconds, the devices of servers that are gone (a release
    that failed on a locked database, a crash); one per allocator class in the hub process. Needs a running loop."""
    key = f"{type(allocator).__module__}.{type(allocator).__qualname__}"
    loop = _reconcilers.get(key)
    if loop is None:
        async def reconcile():
            reserved = await asyncio.to_thread(reserved_holders, allocator)
            await asyncio.to_thread(allocator.reconcile, lambda h: server_alive(h) or h.holder in reserved)

        loop = _reconcilers[key] = PeriodicLoop("trainhub-ledger-reconcile", reconcile, interval, log)
        loop.start()
    return loop
