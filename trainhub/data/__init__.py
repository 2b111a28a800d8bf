"""Fast sharded data loading over fsspec (local folders and S3).

- :func:`pack` turns a prefix of many small files into WebDataset-compatible tar shards plus
  an ``index.json``.
- :class:`ShardReader` streams samples back: whole-shard reads with parallel prefetch,
  shuffle buffer, rank/worker splitting, ``set_epoch``; no PyTorch needed.
- :class:`TorchShardDataset` (or ``reader.as_torch()``) is the same reader as a
  ``torch.utils.data.IterableDataset`` when PyTorch is installed.
- :func:`list_page` pages through a large folder for the storage browser.
"""

from .exceptions import (
    CorruptShardError,
    DataError,
    EmptySourceError,
    IndexNotFoundError,
    InvalidURLError,
    ShardNotFoundError,
)
from .listing import ListPage, list_page
from .packing import INDEX_NAME, pack, parse_size
from .reader import BASIC_DECODERS, ShardReader
from .storage import ENV_STORAGE_OPTIONS

__all__ = [
    "BASIC_DECODERS",
    "CorruptShardError",
    "DataError",
    "EmptySourceError",
    "ENV_STORAGE_OPTIONS",
    "INDEX_NAME",
    "IndexNotFoundError",
    "InvalidURLError",
    "ListPage",
    "ShardNotFoundError",
    "ShardReader",
    "TorchShardDataset",
    "list_page",
    "pack",
    "parse_size",
]


def __getattr__(name):
    if name == "TorchShardDataset":
        from .torch_dataset import TorchShardDataset

        return TorchShardDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
