"""PyTorch glue: :class:`TorchShardDataset` (imports torch; the rest of the package does not)."""

from __future__ import annotations

try:
    from torch.utils.data import IterableDataset
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("TorchShardDataset needs PyTorch (pip install torch); ShardReader works without it") from e

from .reader import ShardReader


class TorchShardDataset(ShardReader, IterableDataset):
    """A :class:`ShardReader` that is a ``torch.utils.data.IterableDataset``.

    Use it with ``DataLoader(ds, batch_size=..., num_workers=N)``: each worker reads its own
    shards (from ``get_worker_info()``), each rank its own (``$RANK``/``$WORLD_SIZE`` or
    ``torch.distributed``). Call ``ds.set_epoch(e)`` before creating each epoch's iterator;
    with ``persistent_workers=True`` the workers keep the epoch they started with.
    """
