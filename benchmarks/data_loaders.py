"""The loaders data_bench.py compares, each set up the way its own documentation shows,
reading the same samples from the same S3 server through a ``torch.utils.data.DataLoader``
with the same workers, batch size and shuffle buffer.

Each ``Loader`` has ``prepare()`` (untimed: writing its own format, reported separately),
``reset()`` (untimed: emptying its local cache, so every timed run reads from S3) and
``epoch()`` (timed: build the dataset and loader, read every sample once). ``epoch()``
returns ``(keys, bytes)`` so the benchmark can check that each loader delivered every
sample exactly once.

A loader whose package does not install or does not work here raises ``Unavailable`` with
the reason; the benchmark prints it instead of a time.

Stand-ins and settings the packages need on this machine (said in the table's notes too):
- LitData 0.2.x uploads and downloads through obstore, whose client refuses plain-HTTP
  endpoints unless ``allow_http`` is set, and LitData does not expose that option: the
  benchmark adds it to LitData's obstore client options (``TRAINHUB_BENCH_LITDATA_HTTP``).
- mosaicml-streaming imports ``streaming.vision`` (torchvision) at ``import streaming``; the
  torchvision wheel on PyPI links CUDA libraries that a CPU build of torch does not have, so
  the benchmark registers an empty ``streaming.vision`` module first (its vision datasets
  are not used).
- webdataset opens ``http(s)://`` shard URLs with ``curl``; the shards are private, so it gets
  presigned URLs (made before the timed part, as a user would make them).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tarfile
import tempfile
import types
from itertools import accumulate

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError:  # pragma: no cover - data_bench.py says what to install
    sys.exit("data_bench.py needs PyTorch for the side-by-side DataLoader runs: pip install -e '.[bench]' "
             "(a CPU build: pip install torch==2.13.0)")

from trainhub.data.reader import _shuffled as shuffled  # noqa: E402  (trainhub's shuffle buffer)

MiB = 2**20


class Unavailable(Exception):
    """This loader cannot run here; the message says why."""


def to_records(batch):
    """Collate: ``[(key, bytes)]`` (LitData hands out memoryviews; everyone ships bytes)."""
    out = []
    for s in batch:
        key = s.get("__key__", s.get("key"))
        data = s["jpg"]
        out.append((key, data if isinstance(data, bytes) else bytes(data)))
    return out


def _drain(loader) -> tuple[list[str], int]:
    keys, total = [], 0
    for batch in loader:
        for key, data in batch:
            keys.append(key)
            total += len(data)
    return keys, total


def _loader_kwargs(cfg) -> dict:
    """The DataLoader settings every loader gets. The start method is named because LitData's
    ``optimize`` switches the process-wide default to spawn."""
    kw = {"batch_size": cfg.batch_size, "num_workers": cfg.workers, "collate_fn": to_records}
    if cfg.workers > 0:
        kw["multiprocessing_context"] = "fork"
    return kw


def _data_loader(dataset, cfg, **kw):
    return DataLoader(dataset, **_loader_kwargs(cfg), **kw)


class Config:
    """What every loader shares: endpoint, bucket, credentials, workers, batch, shuffle."""

    def __init__(self, endpoint, bucket, key, secret, workers, batch_size, shuffle_buffer, shard_bytes, tmp, seed=0,
                 shuffle_initial=100):
        self.endpoint, self.bucket, self.key, self.secret = endpoint, bucket, key, secret
        self.workers, self.batch_size, self.shuffle_buffer = workers, batch_size, shuffle_buffer
        #: samples buffered before the first is handed out (webdataset's default ``initial``)
        self.shuffle_initial = min(shuffle_initial, shuffle_buffer)
        self.shard_bytes, self.tmp, self.seed = shard_bytes, tmp, seed
        self.storage_options = {"endpoint_url": endpoint, "key": key, "secret": secret}

    def s3fs(self):
        import s3fs

        return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, **self.storage_options)


class Loader:
    name = ""
    package = ""
    note = ""

    def __init__(self, cfg: Config, raw_paths: list[str], shard_urls: list[str]):
        self.cfg, self.raw_paths, self.shard_urls = cfg, raw_paths, shard_urls
        self.prepare_seconds = 0.0

    def prepare(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def epoch(self) -> tuple[list[str], int]:
        raise NotImplementedError

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(self.package)
        except PackageNotFoundError:
            raise Unavailable(f"{self.package} is not installed (pip install -e '.[bench]')") from None


class TrainhubLoader(Loader):
    name = "trainhub ShardReader"
    package = "trainhub"
    note = "packed tar shards + index.json; shuffle_buffer, shuffle_initial"
    direct_http = True

    def epoch(self):
        from trainhub.data import TorchShardDataset

        ds = TorchShardDataset(f"s3://{self.cfg.bucket}/shards", shuffle_buffer=self.cfg.shuffle_buffer,
                               shuffle_initial=self.cfg.shuffle_initial, seed=self.cfg.seed,
                               storage_options=self.cfg.storage_options, direct_http=self.direct_http)
        return _drain(_data_loader(ds, self.cfg))


class TrainhubS3fsLoader(TrainhubLoader):
    name = "trainhub via s3fs (info)"
    note = "the same reader with direct_http=False: s3fs's cat_file (HEAD + GET), as before"
    direct_http = False


class WebDatasetLoader(Loader):
    name = "webdataset"
    package = "webdataset"
    note = "same tar shards, presigned URLs via curl; .shuffle(buffer, initial)"

    def prepare(self):
        self.version()
        if shutil.which("curl") is None:
            raise Unavailable("webdataset reads http(s) URLs with curl, which is not installed")
        fs = self.cfg.s3fs()
        self.urls = [fs.sign(u, expiration=24 * 3600) for u in self.shard_urls]

    def epoch(self):
        import webdataset as wds

        ds = wds.WebDataset(self.urls, shardshuffle=len(self.urls), seed=self.cfg.seed, empty_check=False,
                            workersplitter=wds.split_by_worker).shuffle(self.cfg.shuffle_buffer,
                                                                         initial=self.cfg.shuffle_initial)
        return _drain(_data_loader(ds, self.cfg))


def _tar_samples(stream, url):
    """Group a streamed tar's members into ``{"__key__", ext: bytes}`` (webdataset's rule)."""
    current = None
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            head, _, base = member.name.rpartition("/")
            stem, _, ext = base.partition(".")
            key = (head + "/" if head else "") + stem
            data = tar.extractfile(member).read()
            if current is None or current["__key__"] != key:
                if current is not None:
                    yield current
                current = {"__key__": key, "__url__": url}
            current[ext] = data
    if current is not None:
        yield current


class S3TorchTarDataset(IterableDataset):
    """S3IterableDataset over the shard objects (split across workers by the connector),
    each object streamed through tarfile into samples, then the same shuffle buffer as
    trainhub's (the algorithm is the same for both, so only the I/O differs)."""

    def __init__(self, cfg: Config, uris: list[str]):
        self.cfg, self.uris = cfg, uris

    def __iter__(self):
        from s3torchconnector import S3ClientConfig, S3IterableDataset

        uris = list(self.uris)
        random.Random(f"{self.cfg.seed}:shards").shuffle(uris)
        ds = S3IterableDataset.from_objects(uris, region="us-east-1", endpoint=self.cfg.endpoint,
                                            s3client_config=S3ClientConfig(force_path_style=True),
                                            enable_sharding=True)
        info = get_worker_info()
        wid = info.id if info is not None else 0

        def samples():
            for obj in ds:
                yield from _tar_samples(obj, obj.key)
        return shuffled(samples(), self.cfg.shuffle_buffer, random.Random(f"{self.cfg.seed}:{wid}"),
                        self.cfg.shuffle_initial)


class S3TorchLoader(Loader):
    name = "s3torchconnector"
    package = "s3torchconnector"
    note = "same tar shards, AWS CRT client; tarfile + the same shuffle buffer"

    def prepare(self):
        self.version()
        try:
            import s3torchconnector  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"import s3torchconnector failed: {e}") from None

    def epoch(self):
        return _drain(_data_loader(S3TorchTarDataset(self.cfg, self.shard_urls), self.cfg))


def _litdata_allow_http() -> None:
    import litdata.streaming.downloader as downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True


if os.environ.get("TRAINHUB_BENCH_LITDATA_HTTP"):  # also in LitData's spawned optimize workers
    try:
        _litdata_allow_http()
    except ImportError:
        pass


def litdata_sample(path: str) -> dict:
    """LitData ``optimize`` function: one raw sample from S3 (runs in LitData's workers)."""
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=os.environ["TRAINHUB_BENCH_S3_ENDPOINT"],
                           key=os.environ["AWS_ACCESS_KEY_ID"], secret=os.environ["AWS_SECRET_ACCESS_KEY"])
    return {"key": path.rsplit("/", 1)[-1].split(".", 1)[0], "jpg": fs.cat_file(path)}


class LitDataLoader(Loader):
    name = "litdata"
    package = "litdata"
    note = "optimize() chunks; shuffle=True (no buffer size)"

    def _options(self):
        return {"endpoint_url": self.cfg.endpoint, "aws_access_key_id": self.cfg.key,
                "aws_secret_access_key": self.cfg.secret}

    def prepare(self):
        self.version()
        os.environ["TRAINHUB_BENCH_LITDATA_HTTP"] = "1"
        os.environ["TRAINHUB_BENCH_S3_ENDPOINT"] = self.cfg.endpoint
        root = os.path.join(self.cfg.tmp, "litdata")
        os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = os.path.join(root, "optimize-chunks")
        os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = os.path.join(root, "optimize-data")
        try:
            import litdata
            _litdata_allow_http()
        except Exception as e:
            raise Unavailable(f"import litdata failed: {e}") from None
        self.cache = os.path.join(root, "cache")
        litdata.optimize(fn=litdata_sample, inputs=list(self.raw_paths),
                         output_dir=f"s3://{self.cfg.bucket}/litdata", chunk_bytes=self.cfg.shard_bytes,
                         num_workers=max(1, self.cfg.workers), storage_options=self._options(), mode="overwrite")
        if not self.cfg.s3fs().exists(f"{self.cfg.bucket}/litdata/index.json"):
            raise Unavailable("litdata.optimize wrote no index.json to S3 (see its log above)")

    def reset(self):
        shutil.rmtree(self.cache, ignore_errors=True)
        os.makedirs(self.cache)

    def epoch(self):
        import litdata

        ds = litdata.StreamingDataset(f"s3://{self.cfg.bucket}/litdata", storage_options=self._options(),
                                      shuffle=True, seed=self.cfg.seed, cache_dir=self.cache)
        loader = litdata.StreamingDataLoader(ds, **_loader_kwargs(self.cfg))
        return _drain(loader)


def _import_streaming():
    if "streaming" not in sys.modules:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


class MosaicLoader(Loader):
    name = "mosaicml-streaming"
    package = "mosaicml-streaming"
    note = "MDS shards; shuffle_block_size = buffer"

    def prepare(self):
        self.version()
        os.environ["S3_ENDPOINT_URL"] = self.cfg.endpoint
        try:
            streaming = _import_streaming()
        except Exception as e:
            raise Unavailable(f"import streaming failed: {e}") from None
        fs = self.cfg.s3fs()
        columns = {"key": "str", "jpg": "bytes"}
        with streaming.MDSWriter(out=f"s3://{self.cfg.bucket}/mds", columns=columns,
                                 size_limit=self.cfg.shard_bytes, compression=None) as writer:
            for i in range(0, len(self.raw_paths), 256):
                chunk = self.raw_paths[i:i + 256]
                blobs = fs.cat(chunk)
                for p in chunk:
                    writer.write({"key": p.rsplit("/", 1)[-1].split(".", 1)[0], "jpg": blobs[p]})
        self.local = None

    def reset(self):
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        if self.local:
            shutil.rmtree(self.local, ignore_errors=True)
        self.local = tempfile.mkdtemp(prefix="mds-", dir=self.cfg.tmp)

    def epoch(self):
        streaming = _import_streaming()
        ds = streaming.StreamingDataset(remote=f"s3://{self.cfg.bucket}/mds", local=self.local, shuffle=True,
                                        shuffle_seed=self.cfg.seed, shuffle_block_size=self.cfg.shuffle_buffer,
                                        batch_size=self.cfg.batch_size)
        try:
            return _drain(_data_loader(ds, self.cfg))
        finally:
            del ds


class _LocalFiles:
    """Map-style dataset over local files (what a user who copied the data to disk runs)."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        p = self.paths[i]
        with open(p, "rb") as f:
            return {"__key__": os.path.basename(p).split(".", 1)[0], "jpg": f.read()}


def drop_page_cache(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class LocalDiskLoader(Loader):
    name = "local disk, cold cache"
    package = "torch"
    note = "one file per sample, DataLoader(shuffle=True); page cache dropped first"

    def __init__(self, cfg, raw_paths, shard_urls, local_paths):
        super().__init__(cfg, raw_paths, shard_urls)
        self.local_paths = local_paths

    def reset(self):
        drop_page_cache(self.local_paths)

    def epoch(self):
        g = torch.Generator()
        g.manual_seed(self.cfg.seed)
        return _drain(_data_loader(_LocalFiles(self.local_paths), self.cfg, shuffle=True, generator=g))


class _InMemory(IterableDataset):
    """Distinct in-memory samples of the same sizes: what the DataLoader's inter-process
    transfer alone costs (no reading at all), the floor for every loader here."""

    def __init__(self, n, size):
        self.n, self.size = n, size

    def __iter__(self):
        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        blob = os.urandom(self.size)
        for i in range(wid, self.n, workers):
            yield {"__key__": f"{i:06d}", "jpg": blob[:-4] + i.to_bytes(4, "big")}


class FloorLoader(Loader):
    name = "floor: bytes from memory"
    package = "torch"
    note = "no reading: the DataLoader's transfer cost alone (info)"

    def __init__(self, cfg, raw_paths, shard_urls, sample_size):
        super().__init__(cfg, raw_paths, shard_urls)
        self.sample_size = sample_size

    def epoch(self):
        return _drain(_data_loader(_InMemory(len(self.raw_paths), self.sample_size), self.cfg))


class _ShardBytesOnly(IterableDataset):
    """Each worker GETs its shards as ShardReader does in a worker (trainhub's direct GET into
    two reused buffers, one shard ahead) and hands out every shard's samples through the same
    shuffle buffer, each sample copied once out of the shard at a fixed stride: no tar
    headers read. Only the cost is real: the bytes are not the samples'."""

    def __init__(self, cfg, shard_urls, counts, sizes, keys, size):
        self.cfg, self.shard_urls, self.counts, self.sizes = cfg, shard_urls, counts, sizes
        self.keys, self.size = keys, size
        self.firsts = list(accumulate(counts, initial=0))  # shard i's samples are keys[firsts[i]:firsts[i + 1]]

    def __iter__(self):
        from concurrent.futures import ThreadPoolExecutor

        from trainhub.data.s3direct import direct_getter

        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = list(range(wid, len(self.shard_urls), workers))
        getter = direct_getter(self.cfg.s3fs())
        buffers = [bytearray(max(self.sizes)) for _ in range(2)]
        stride = self.size

        def get(n):
            i = mine[n]
            return getter.get(self.shard_urls[i].split("://", 1)[1], self.sizes[i], into=buffers[n % 2])

        def samples():
            with ThreadPoolExecutor(1) as pool:
                ahead = pool.submit(get, 0) if mine else None
                for n, i in enumerate(mine):
                    view = memoryview(ahead.result())
                    ahead = pool.submit(get, n + 1) if n + 1 < len(mine) else None
                    for j in range(self.counts[i]):
                        yield {"__key__": self.keys[self.firsts[i] + j], "jpg": bytes(view[j * stride:(j + 1) * stride])}
                    view.release()

        rng = random.Random(f"{self.cfg.seed}:{wid}")
        return shuffled(samples(), self.cfg.shuffle_buffer, rng, self.cfg.shuffle_initial)


class S3BoundLoader(Loader):
    """What reading these shards from this server through this shuffle buffer costs before any
    parsing: ShardReader's GETs, buffer and one copy per sample, with no tar header read."""

    name = "bound: shard GETs only"
    package = "trainhub"
    note = "ShardReader's GETs and shuffle buffer, no tar parsing: what these shards cost here before parsing (info)"

    def __init__(self, cfg, raw_paths, shard_urls, sample_size):
        super().__init__(cfg, raw_paths, shard_urls)
        self.sample_size = sample_size
        self.counts: list[int] = []
        self.sizes: list[int] = []

    def prepare(self):
        import json

        index = json.loads(self.cfg.s3fs().cat_file(f"{self.cfg.bucket}/shards/index.json"))
        entries = {e["name"]: e for e in index["shards"]}
        mine = [entries[url.rsplit("/", 1)[-1]] for url in self.shard_urls]
        self.counts, self.sizes = [e["samples"] for e in mine], [e["bytes"] for e in mine]

    def epoch(self):
        from trainhub.data.s3direct import warm

        warm(self.cfg.s3fs())  # as ShardReader does where it is built: forked workers adopt its botocore session
        keys = [os.path.basename(p).split(".", 1)[0] for p in self.raw_paths]
        dataset = _ShardBytesOnly(self.cfg, self.shard_urls, self.counts, self.sizes, keys, self.sample_size)
        return _drain(_data_loader(dataset, self.cfg))


ALTERNATIVES = [WebDatasetLoader, LitDataLoader, MosaicLoader, S3TorchLoader]
