"""Free-GPU bookkeeping and gang placement: best fit, or end-aligned.

Nodes are bucketed by their number of free GPUs, so "does a gang of W workers × g GPUs fit?" costs
O(largest node) instead of O(nodes): with identical workers the gang fits iff
``sum(free_n // g) >= W``, and any greedy placement then succeeds. Buckets are insertion-ordered
dicts (never sets) so that node choice is deterministic.

With ``ends`` (per node, the latest time limit of what runs there) placement is *end-aligned*: a
worker goes to a node whose work already runs at least as long as the job may, fewest free GPUs
first; only if there is none does it extend a node's horizon, the latest one (least extension). So
a week-long 1-GPU job joins the nodes already pinned for a week instead of pinning one more, and
nodes drain whole for gang jobs. ``place(..., extend=False)`` allows only such nodes: the policy asks
it for a job that would run past the head's reservation, so backfill never turns a node that drains
into one pinned for longer. Without ``ends`` it is plain best fit (the FIFO baseline).
"""

from __future__ import annotations

import math
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


def node_ends(running: Iterable[Allocation]) -> dict[str, float]:
    """Per node, the latest ``end`` of what holds GPUs there (``inf`` for no time limit or a server)."""
    ends: dict[str, float] = {}
    for alloc in running:
        end = alloc.end
        end = math.inf if end is None else end
        for node, gpus in alloc.placement:
            if gpus and ends.get(node, -math.inf) < end:
                ends[node] = end
    return ends


#: Nodes an end-aligned pick examines at most once it has a candidate (bounds a pass on big clusters).
SCAN_LIMIT = 64


class FreeIndex:
    """Free GPUs per node with buckets by free count; end-aligned placement when given ``ends``."""

    __slots__ = ("free", "buckets", "total", "kmax", "ends")

    def __init__(self, free: Mapping[str, int], kmax: int | None = None, ends: dict[str, float] | None = None):
        self.ends = ends  # shared with the caller (and other indexes of the pass): updated by place()
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

    def pick(self, gpus_per_worker: int, end: float | None = None) -> str | None:
        """The node for one worker: best fit (fewest free GPUs that still hold it), end-aligned when
        this index has ``ends`` and ``end`` (the job's latest end, ``inf`` without a time limit) is given."""
        buckets = self.buckets
        ends = self.ends
        if ends is None or end is None:
            for f in range(max(gpus_per_worker, 1), self.kmax + 1):
                if buckets[f]:
                    return next(iter(buckets[f]))
            return None
        # Key: a node whose horizon covers `end` (fewest free first) beats any it would extend; of
        # those, the latest horizon (least extension), then fewest free. Empty nodes come last.
        best = None
        best_h = -math.inf
        seen = 0
        for f in range(max(gpus_per_worker, 1), self.kmax + 1):
            for node in buckets[f]:
                h = ends.get(node, -math.inf)
                if h >= end:
                    return node
                if best is None or h > best_h:
                    best, best_h = node, h
                seen += 1
                if seen >= SCAN_LIMIT:
                    return best
        return best

    def place(self, workers: int, gpus_per_worker: int, end: float | None = None, extend: bool = True) -> list[str] | None:
        """Place each worker in turn (see :meth:`pick`), taking the GPUs; ``None`` (and no change) if it
        won't fit. ``extend=False`` (with ``ends`` and ``end``): only on nodes whose work already lasts
        until ``end``, fewest free GPUs first, looking at most at ``SCAN_LIMIT + workers`` nodes."""
        if not self.fits(workers, gpus_per_worker):
            return None
        if not extend and self.ends is not None and end is not None:
            return self._place_within(workers, gpus_per_worker, end)
        ends = self.ends if end is not None else None
        nodes = []
        for _ in range(workers):
            node = self.pick(gpus_per_worker, end)
            assert node is not None  # fits() guarantees it
            self.set(node, self.free[node] - gpus_per_worker)
            if ends is not None and ends.get(node, -math.inf) < end:
                ends[node] = end
            nodes.append(node)
        return nodes

    def _place_within(self, workers: int, g: int, end: float) -> list[str] | None:
        ends, buckets = self.ends, self.buckets
        chosen: list[tuple[str, int]] = []
        need, seen, limit = workers, 0, SCAN_LIMIT + workers
        for f in range(max(g, 1), self.kmax + 1):
            for node in buckets[f]:
                if ends.get(node, -math.inf) >= end:
                    k = min(f // g, need)
                    chosen.append((node, k))
                    need -= k
                    if need == 0:
                        break
                seen += 1
                if seen >= limit:
                    break
            if need == 0 or seen >= limit:
                break
        if need:
            return None
        nodes = []
        for node, k in chosen:  # applied after the scan: set() moves nodes between buckets
            self.set(node, self.free[node] - k * g)
            nodes += [node] * k
        return nodes
