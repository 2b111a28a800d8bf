"""Reading packed shards: :class:`ShardReader`.

The reader resolves its shard list once (from ``index.json``, so nothing is listed), picks
this process's share (rank, then DataLoader worker), downloads whole shards ``prefetch`` at a
time, unpacks them into sample dicts, and optionally shuffles within a buffer. On S3 the
downloads are presigned plain-HTTP GETs into one buffer per shard, large shards as parallel
byte ranges (:mod:`trainhub.data.s3direct`); other async filesystems run as coroutines on
their event loop, the rest on a thread pool.
Orders are deterministic for a given ``seed`` and epoch.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import random
import re
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, Mapping

from .exceptions import CorruptShardError, DataError, IndexNotFoundError, InvalidURLError, ShardNotFoundError
from .packing import INDEX_FORMAT, INDEX_NAME
from . import s3direct
from .s3direct import direct_getter
from .storage import full_url, is_async, join, protocol_of, url_to_fs
from .tario import iter_samples

log = logging.getLogger(__name__)

Sample = dict

#: Shards downloaded ahead by default: reading in one process, and in each of several DataLoader
#: workers. Measured on 2 cores with 2 workers (benchmarks/README.md): 1 per worker read an epoch
#: 7 % faster than 4, whose threads contended with the workers' own work.
PREFETCH = 4
WORKER_PREFETCH = 1


def _utf8(b: bytes) -> str:
    return b.decode("utf-8")


def _cls(b: bytes) -> int:
    return int(b.decode("ascii").strip())


def _npy(b: bytes):
    import numpy

    return numpy.load(io.BytesIO(b), allow_pickle=False)


#: Decoders used by ``decode="basic"``: text, class labels, JSON and NumPy arrays. Other
#: fields (images, audio...) stay bytes; pass your own mapping or callable for those.
BASIC_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "txt": _utf8,
    "text": _utf8,
    "cls": _cls,
    "json": json.loads,
    "npy": _npy,
}

_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_braces(url: str) -> list[str]:
    """``"shard-{000..002}.tar" -> ["shard-000.tar", "shard-001.tar", "shard-002.tar"]``."""
    m = _BRACES.search(url)
    if not m:
        return [url]
    lo, hi = m.group(1), m.group(2)
    width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
    out = []
    for i in range(int(lo), int(hi) + 1):
        out.extend(expand_braces(url[:m.start()] + str(i).zfill(width) + url[m.end():]))
    return out


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise DataError(f"${name} must be an integer, got {raw!r}") from None


class ShardReader:
    """Iterate over the samples of packed shards.

    Parameters
    ----------
    url_or_shards:
        A folder written by :func:`trainhub.data.pack` (local path or ``s3://bucket/prefix``;
        its ``index.json`` is read), the URL of an ``index.json``, one shard URL, a brace
        pattern (``.../shard-{000000..000009}.tar``) or a list of shard URLs.
    shuffle_buffer:
        Samples held for shuffling (0: no shuffling, shards and samples in stored order).
        When > 0, the shard order is also shuffled per epoch (the same way on every rank).
    seed:
        Base seed; the orders depend on ``(seed, epoch, rank, worker)`` only.
    prefetch:
        Shards downloaded ahead of the one being read, in parallel (0: read one at a time).
        Memory use is about ``(prefetch + 1) * shard_size`` per reading process. ``None``
        (default): ``PREFETCH`` when reading in one process, ``WORKER_PREFETCH`` in each of
        several DataLoader workers, which already download in parallel (more threads per
        worker only contend for the CPU with the workers' own work).
    rank, world_size:
        This process's place among data-parallel processes; default ``$RANK`` /
        ``$WORLD_SIZE``, then ``torch.distributed`` when initialised, then 0 / 1.
    worker_info:
        ``(worker_id, num_workers)`` or an object with ``.id`` and ``.num_workers``;
        default ``torch.utils.data.get_worker_info()`` when PyTorch is loaded.
    storage_options:
        fsspec options (e.g. ``{"endpoint_url": ..., "key": ..., "secret": ...}``); ``None``
        reads ``$TRAINHUB_STORAGE_OPTIONS`` for remote URLs.
    decode:
        ``None`` (fields stay bytes), ``"basic"`` (:data:`BASIC_DECODERS`), a mapping
        ``{ext: fn(bytes)}``, or a callable ``fn(sample) -> sample``.
    direct_http:
        On S3 (s3fs), fetch shards with presigned ``http.client`` GETs straight into one
        buffer, no HEAD first, shards larger than 8 MiB as parallel byte ranges (the default);
        ``False`` uses s3fs's ``cat_file``. Filesystems other than s3fs, requester-pays or
        SSE-C options and HTTP proxies always use s3fs.
    shuffle_initial:
        Samples buffered before the first one is handed out (default: the whole
        ``shuffle_buffer``). Smaller values start an epoch sooner: the buffer then grows by one
        sample per sample handed out until it holds ``shuffle_buffer`` (webdataset's
        ``shuffle(bufsize, initial)``), so the first samples are drawn from fewer candidates.

    Shards are split by position: global slot ``rank * num_workers + worker_id`` takes every
    ``world_size * num_workers``-th shard, so the parts are disjoint and together complete.
    Pack at least that many shards (preferably many more) so no slot is empty.
    Call :meth:`set_epoch` before each epoch to get a new order.
    """

    def __init__(
        self,
        url_or_shards: str | os.PathLike | Iterable[str],
        shuffle_buffer: int = 0,
        seed: int = 0,
        prefetch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        worker_info: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        decode: None | str | Mapping[str, Callable[[bytes], Any]] | Callable[[Sample], Sample] = None,
        direct_http: bool = True,
        shuffle_initial: int | None = None,
    ):
        if int(shuffle_buffer) < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {shuffle_buffer!r}")
        if prefetch is not None and int(prefetch) < 0:
            raise ValueError(f"prefetch must be >= 0 or None, got {prefetch!r}")
        if shuffle_initial is not None and int(shuffle_initial) < 1:
            raise ValueError(f"shuffle_initial must be >= 1 or None, got {shuffle_initial!r}")
        self.shuffle_buffer = int(shuffle_buffer)
        self.shuffle_initial = None if shuffle_initial is None else int(shuffle_initial)
        self.seed = seed
        self.prefetch = None if prefetch is None else int(prefetch)
        self.rank = rank
        self.world_size = world_size
        self.worker_info = worker_info
        self.storage_options = None if storage_options is None else dict(storage_options)
        self.decode = self._make_decoder(decode)
        self._decode_arg = decode
        self.direct_http = bool(direct_http)
        self.epoch = 0
        self.index: dict | None = None
        #: shard URL -> size in bytes, from the index (lets S3 reads skip the HEAD and split ranges)
        self.shard_bytes: dict[str, int] = {}
        self.shards: list[str] = self._resolve(url_or_shards)
        if not self.shards:
            raise DataError(f"no shards to read from {url_or_shards!r}")
        self.total_samples: int | None = self.index["total_samples"] if self.index else None
        if self.direct_http and protocol_of(self.shards[0]) in ("s3", "s3a"):
            s3direct.warm(url_to_fs(self.shards[0], self.storage_options)[0])

    # -- setup -------------------------------------------------------------------------

    @staticmethod
    def _make_decoder(decode):
        if decode is None:
            return None
        if decode == "basic":
            decode = BASIC_DECODERS
        if isinstance(decode, Mapping):
            return _FieldDecoder(decode)
        if callable(decode):
            return decode
        raise ValueError(f"decode must be None, 'basic', a mapping of ext -> function or a callable, got {decode!r}")

    def _resolve(self, source) -> list[str]:
        if isinstance(source, (str, os.PathLike)):
            url = os.fspath(source)
            if _BRACES.search(url):
                return expand_braces(url)
            if url.endswith(".tar"):
                return [url]
            fs, path = url_to_fs(url, self.storage_options)
            if path.endswith(".json"):
                index_path, base = path, path.rsplit("/", 1)[0] if "/" in path else ""
            else:
                index_path, base = join(fs, path, INDEX_NAME), path
            self.index = self._load_index(fs, index_path, url)
            urls = [full_url(fs, join(fs, base, s["name"])) for s in self.index["shards"]]
            self.shard_bytes = {u: s["bytes"] for u, s in zip(urls, self.index["shards"])
                                if isinstance(s.get("bytes"), int)}
            return urls
        try:
            shards = [os.fspath(s) for s in source]
        except TypeError:
            raise InvalidURLError(f"expected a URL, a folder or a list of shard URLs, got {source!r}") from None
        for s in shards:
            if not isinstance(s, str) or not s:
                raise InvalidURLError(f"bad shard URL {s!r} in the shard list")
        return shards

    def _index_bytes(self, fs, index_path: str) -> bytes | bytearray:
        """The index's bytes; with ``direct_http`` on S3, one direct GET (5-10 ms sooner than
        through s3fs's event loop, on the way to every first batch)."""
        getter = None
        if self.direct_http:
            s3direct.warm(fs)  # before the getter, so that it signs with the warmed presigner
            getter = direct_getter(fs)
        if getter is None:
            return fs.cat_file(index_path)
        try:
            return getter.get(index_path)
        finally:
            getter.close()

    def _load_index(self, fs, index_path: str, url: str) -> dict:
        try:
            raw = self._index_bytes(fs, index_path)
        except FileNotFoundError:
            raise IndexNotFoundError(
                f"no {INDEX_NAME} at {full_url(fs, index_path)}: pack the data first "
                f"(trainhub.data.pack(src, {url!r}) or `trainhub data pack SRC {url}`), "
                "or pass a list of shard URLs"
            ) from None
        except IsADirectoryError:
            raise IndexNotFoundError(f"{full_url(fs, index_path)} is a folder, not a shard index") from None
        try:
            index = json.loads(raw)
        except ValueError as e:
            raise CorruptShardError(f"{full_url(fs, index_path)} is not valid JSON: {e}") from None
        if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or not isinstance(index.get("shards"), list):
            raise CorruptShardError(f"{full_url(fs, index_path)} is not a trainhub shard index (format {INDEX_FORMAT!r})")
        return index

    # -- splitting ---------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shard and sample order the next iteration uses."""
        self.epoch = int(epoch)

    def _rank_world(self) -> tuple[int, int]:
        rank, world = self.rank, self.world_size
        if rank is None:
            rank = _env_int("RANK")
        if world is None:
            world = _env_int("WORLD_SIZE")
        if rank is None and world is None and sys.modules.get("torch") is not None:
            dist = getattr(sys.modules["torch"], "distributed", None)
            if dist is not None and dist.is_available() and dist.is_initialized():
                rank, world = dist.get_rank(), dist.get_world_size()
        rank = 0 if rank is None else int(rank)
        world = 1 if world is None else int(world)
        if world < 1 or not 0 <= rank < world:
            raise DataError(f"invalid rank {rank} for world size {world}: need 0 <= rank < world_size")
        return rank, world

    def _worker(self) -> tuple[int, int]:
        info = self.worker_info
        if info is None and sys.modules.get("torch") is not None:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
        if info is None:
            return 0, 1
        if isinstance(info, tuple):
            wid, n = info
        else:
            wid, n = info.id, info.num_workers
        if n < 1 or not 0 <= wid < n:
            raise DataError(f"invalid worker {wid} of {n}")
        return int(wid), int(n)

    def shards_for(self, rank: int = 0, world_size: int = 1, worker_id: int = 0, num_workers: int = 1,
                   epoch: int | None = None) -> list[str]:
        """The shards that ``(rank, worker_id)`` reads in ``epoch``, in reading order."""
        shards = list(self.shards)
        if self.shuffle_buffer > 0:
            random.Random(f"{self.seed}:{self.epoch if epoch is None else epoch}:shards").shuffle(shards)
        slots = world_size * num_workers
        return shards[rank * num_workers + worker_id::slots]

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Sample]:
        rank, world = self._rank_world()
        wid, nworkers = self._worker()
        if len(self.shards) < world * nworkers:
            log.warning("only %d shard(s) for %d rank(s) x %d worker(s): some readers get no data; "
                        "pack with a smaller shard_size", len(self.shards), world, nworkers)
        mine = self.shards_for(rank, world, wid, nworkers)
        samples = self._samples(mine)
        if self.shuffle_buffer > 0:
            rng = random.Random(f"{self.seed}:{self.epoch}:{rank}:{wid}")
            samples = _shuffled(samples, self.shuffle_buffer, rng, self.shuffle_initial)
        if self.decode is None:
            return samples
        return map(self.decode, samples)

    def _samples(self, urls: list[str]) -> Iterator[Sample]:
        for url, data in self._fetch_all(urls):
            yield from iter_samples(data, url)

    @staticmethod
    def _fetch_error(url: str, error: Exception) -> Exception:
        if isinstance(error, IsADirectoryError):
            return ShardNotFoundError(f"shard {url} is a folder, not a tar file")
        return ShardNotFoundError(f"shard {url} does not exist (was the folder re-packed or moved?)")

    def _fetch_all(self, urls: list[str]) -> Iterator[tuple[str, bytes | bytearray]]:
        fetcher = _Fetcher(self.storage_options, self.shard_bytes, self.direct_http)
        try:
            yield from self._prefetched(urls, fetcher)
        finally:
            fetcher.close()

    def _ahead(self) -> int:
        """Shards this process downloads ahead (``prefetch``, or its default where this process reads)."""
        if self.prefetch is not None:
            return self.prefetch
        return WORKER_PREFETCH if self._worker()[1] > 1 else PREFETCH

    def _prefetched(self, urls: list[str], fetcher: "_Fetcher") -> Iterator[tuple[str, bytes | bytearray]]:
        ahead = self._ahead()
        if ahead == 0 or len(urls) <= 1:
            for url in urls:
                data = fetcher.fetch(url)
                yield url, data
                fetcher.recycle(data)  # the consumer has copied the samples out of it
            return
        pool = ThreadPoolExecutor(max_workers=min(ahead, len(urls)), thread_name_prefix="trainhub-shards")
        pending: deque = deque()
        todo = iter(urls)
        try:
            for url in islice(todo, ahead):
                pending.append((url, fetcher.submit(pool, url)))
            while pending:
                url, future = pending.popleft()
                try:
                    data = future.result()
                except (FileNotFoundError, IsADirectoryError) as e:
                    raise self._fetch_error(url, e) from None
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append((nxt, fetcher.submit(pool, nxt)))
                yield url, data
                fetcher.recycle(data)  # the consumer has copied the samples out of it
                del data
        finally:
            for _, future in pending:
                future.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    # -- PyTorch -----------------------------------------------------------------------

    def _init_kwargs(self) -> dict:
        return dict(url_or_shards=list(self.shards), shuffle_buffer=self.shuffle_buffer, seed=self.seed,
                    shuffle_initial=self.shuffle_initial,
                    prefetch=self.prefetch, rank=self.rank, world_size=self.world_size,
                    worker_info=self.worker_info, storage_options=self.storage_options, decode=self._decode_arg,
                    direct_http=self.direct_http)

    def as_torch(self):
        """This reader as a ``torch.utils.data.IterableDataset`` (needs PyTorch)."""
        from .torch_dataset import TorchShardDataset

        ds = TorchShardDataset(**self._init_kwargs())
        ds.index, ds.total_samples, ds.epoch = self.index, self.total_samples, self.epoch
        ds.shard_bytes = dict(self.shard_bytes)
        return ds

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self.shards)} shards, samples={self.total_samples}, "
                f"shuffle_buffer={self.shuffle_buffer}, seed={self.seed}, epoch={self.epoch})")


class _Fetcher:
    """Downloads for one iteration: picks per filesystem between a direct S3 getter
    (:func:`~trainhub.data.s3direct.direct_getter`), coroutines on an async filesystem's
    loop, and plain ``cat_file`` on a thread; ``close()`` ends its range pools.

    Direct downloads of shards whose size the index records go into buffers of the largest
    shard's size that are reused once the consumer is done with a shard (``recycle``): fresh
    buffers cost a page fault per 4 KiB, a large share of the CPU of reading at memory speed.
    """

    def __init__(self, storage_options, shard_bytes: Mapping[str, int], direct_http: bool, keep_buffers: int = 6):
        self.storage_options = storage_options
        self.shard_bytes = shard_bytes
        self.direct_http = direct_http
        self._getters: dict[int, Any] = {}
        self._capacity = max(shard_bytes.values(), default=0)
        self._free: list[bytearray] = []
        self._ours: set[int] = set()
        self._keep = keep_buffers
        self._lock = threading.Lock()

    def _buffer(self, size: int | None) -> bytearray | None:
        if size is None or size > self._capacity:
            return None
        with self._lock:
            if self._free:
                return self._free.pop()
            buf = bytearray(self._capacity)
            self._ours.add(id(buf))
            return buf

    def recycle(self, data) -> None:
        buf = data.obj if isinstance(data, memoryview) else data
        with self._lock:
            if id(buf) in self._ours and len(self._free) < self._keep and all(b is not buf for b in self._free):
                self._free.append(buf)

    def _getter(self, fs):
        if not self.direct_http:
            return None
        key = id(fs)
        if key not in self._getters:  # (fs, getter): holding fs keeps its id from being reused
            self._getters[key] = (fs, direct_getter(fs))
        return self._getters[key][1]

    def fetch(self, url: str) -> bytes | bytearray:
        fs, path = url_to_fs(url, self.storage_options)
        try:
            getter = self._getter(fs)
            if getter is not None:
                size = self.shard_bytes.get(url)
                return getter.get(path, size, into=self._buffer(size))
            return fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError) as e:
            raise ShardReader._fetch_error(url, e) from None

    def submit(self, pool, url: str):
        """Start downloading ``url``; returns a concurrent.futures.Future of its bytes."""
        fs, path = url_to_fs(url, self.storage_options)
        if self._getter(fs) is None and is_async(fs) and getattr(fs, "loop", None) is not None:
            return asyncio.run_coroutine_threadsafe(fs._cat_file(path), fs.loop)
        return pool.submit(self.fetch, url)

    def close(self) -> None:
        for _, getter in self._getters.values():
            if getter is not None:
                getter.close()


class _FieldDecoder:
    """Apply ``{ext: fn(bytes)}`` to the fields a sample has (a class, so readers pickle)."""

    def __init__(self, table: Mapping[str, Callable[[bytes], Any]]):
        self.table = dict(table)

    def __call__(self, sample: Sample) -> Sample:
        for ext, fn in self.table.items():
            if ext in sample:
                sample[ext] = fn(sample[ext])
        return sample


def _shuffled(samples: Iterator[Sample], size: int, rng: random.Random, initial: int | None = None) -> Iterator[Sample]:
    """Shuffle through a buffer of ``size`` samples, handing out the first once ``initial``
    are buffered (``None``: once it is full); in between, the buffer grows by one sample per
    sample handed out. ``initial >= size`` is the plain buffer shuffle."""
    initial = size if initial is None else max(1, min(initial, size))
    buf: list[Sample] = []
    grow = False
    for sample in samples:
        if len(buf) < initial:
            buf.append(sample)
            continue
        if len(buf) < size:
            buf.append(sample)
            grow = not grow
            if grow:
                continue
            i = rng.randrange(len(buf))
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
            continue
        i = rng.randrange(size)
        yield buf[i]
        buf[i] = sample
    rng.shuffle(buf)
    yield from buf
