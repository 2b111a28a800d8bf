"""Free-GPU bookkeeping and best-fit gang placement.

Nodes are bucketed by their number of free GPUs, so "does a gang of W workers × g GPUs fit?" costs
O(largest node) instead of O(nodes): with identical workers the gang fits iff
``sum(free_n // g) >= W``, and any greedy placement then succeeds. Buckets are insertion-ordered
dicts (never sets) so that node choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .model import Allocation


def free_gpus(capacity: Mapping[str, int], running: Iterable[Allocation]) -> dict[str, int]:
    """Capacity minus what ``running`` holds, per node (nodes not in ``capacity`` are ignored)."""
    free = dict(capacity)
    for alloc in running:
        for node, gpus in alloc.placement:
            if gpus and node in free:
                free[node] -= gpus
    return free


class FreeIndex:
    """Free GPUs per node with buckets by free count."""

    __slots__ = ("free", "buckets", "total", "kmax")

    def __init__(self, free: Mapping[str, int], kmax: int | None = None):
        self.free = {n: max(0, f) for n, f in free.items()}
        self.kmax = max(self.free.values(), default=0) if kmax is None else kmax
        self.buckets: list[dict[str, None]] = [{} for _ in range(self.kmax + 1)]
        for node, f in self.free.items():
            self.buckets[f][node] = None
        self.total = sum(self.free.values())

    def fits(self, workers: int, gpus_per_worker: int) -> bool:
        g = gpus_per_worker
        if g <= 0:
            return True
        if g > self.kmax or workers * g > self.total:
            return False
        need = workers
        buckets = self.buckets
        for f in range(self.kmax, g - 1, -1):
            count = len(buckets[f])
            if count:
                need -= count * (f // g)
                if need <= 0:
                    return True
        return False

    def set(self, node: str, value: int) -> None:
        old = self.free[node]
        if value == old:
            return
        del self.buckets[old][node]
        self.buckets[value][node] = None
        self.free[node] = value
        self.total += value - old

    def pick(self, gpus_per_worker: int) -> str | None:
        """The node with the fewest free GPUs that still holds one worker (best fit)."""
        buckets = self.buckets
        for f in range(max(gpus_per_worker, 1), self.kmax + 1):
            if buckets[f]:
                return next(iter(buckets[f]))
        return None

    def place(self, workers: int, gpus_per_worker: int) -> list[str] | None:
        """Best-fit each worker in turn, taking the GPUs; ``None`` (and no change) if it won't fit."""
        if not self.fits(workers, gpus_per_worker):
            return None
        nodes = []
        for _ in range(workers):
            node = self.pick(gpus_per_worker)
            assert node is not None  # fits() guarantees it
            self.set(node, self.free[node] - gpus_per_worker)
            nodes.append(node)
        return nodes
