#!/usr/bin/env python
"""Benchmark trainhub.data against the loaders people use instead, on a real (moto) S3 server.

    .venv/bin/python benchmarks/data_bench.py [--quick] [--rounds 5] [--workers 2]

Starts ``moto_server`` on a free loopback port, uploads N x 100 KiB samples (default 10,000: an epoch
well above the shuffle buffers, 2 workers x 500 samples = 10 % of it, as in training; with 2,000 the
buffers held half the epoch and the side-by-side times were mostly how a streaming loader fills and
drains its buffer, see benchmarks/README.md) and measures:

1. Loaders side by side (benchmarks/data_loaders.py): trainhub's ``ShardReader`` (as a
   ``TorchShardDataset``), the ``webdataset`` library, LitData, MosaicML ``streaming`` and the
   S3 connector for PyTorch (``s3torchconnector``), each reading every sample once from the
   same S3 server through a ``torch.utils.data.DataLoader`` with the same number of workers,
   batch size and shuffle buffer, plus a cold local disk (one file per sample, page cache
   dropped) in the same harness, and a bound (info): the same shard GETs and shuffle buffer
   with no tar header read, what reading these shards from this server costs on this machine
   before any parsing. Each loader's own preparation (packing, LitData
   ``optimize``, MDS writing) runs before the timed part and is reported separately; its
   local cache is emptied before every timed run. Rounds are interleaved (the order rotates
   each round) and medians are compared, so load from elsewhere falls on every loader alike.
2. In one process: naive per-file reads (``fs.cat_file`` in a loop; with ``--with-open`` also
   the ``with fs.open(path)`` loop) vs. ``ShardReader`` vs. a plain concurrent s3fs GET of the
   shard objects vs. local disk read file by file, cold and warm.
3. Listing 10,000 objects with raw ``s3fs.ls`` and with ``trainhub.data.listing.list_page``.

Targets: ShardReader >= 1.0x the best alternative loader and >= 1.0x the cold local disk (side
by side); shards / naive >= 10x (one process); list_page walk / raw ls <= 1.2x. Exit status 0
when all targets pass, 1 otherwise. Loaders that do not install or run here are listed with
the reason and left out of "best". moto is CPU-bound and shares the machine with the
benchmark, so absolute numbers understate a real object store; ratios are the point.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from trainhub.backoff import WaitTimeout, poll

from data_loaders import (ALTERNATIVES, Config, FloorLoader, LocalDiskLoader, S3BoundLoader, TrainhubLoader,
                          TrainhubS3fsLoader, Unavailable, drop_page_cache)

ACCESS = {"key": "bench", "secret": "bench"}
MiB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(exe):
        sys.exit(f"moto_server not found next to {sys.executable}; pip install 'moto[server]'")
    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(stop, proc)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return True
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"moto_server did not start on {url}")
            return False

    try:
        poll(answers, what=f"moto_server on {url}", start=0.1, factor=1.0, timeout=30)
    except WaitTimeout:
        sys.exit(f"moto_server did not start on {url}")
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def timed(fn, repeats: int = 1):
    """Run ``fn`` ``repeats`` times; return (median seconds, last result)."""
    times, result = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


LOADER_LOG = os.path.join(tempfile.gettempdir(), f"data-bench-{os.getpid()}.log")


@contextlib.contextmanager
def quiet():
    """Send what the loaders print (LitData and MosaicML log progress) to a file, not the table."""
    log = open(LOADER_LOG, "ab")
    saved = [os.dup(1), os.dup(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        log.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples and objects (about 30 s)")
    ap.add_argument("--samples", type=int, help="number of samples (default 10000, quick 500; see benchmarks/README.md "
                    "for why an epoch must be well above the shuffle buffers)")
    ap.add_argument("--sample-kib", type=int, default=100, help="sample size in KiB (default %(default)s)")
    ap.add_argument("--list-objects", type=int, help="objects for the listing test (default 10000, quick 3000)")
    ap.add_argument("--shard-size", default=None,
                    help="shard size for pack (default: an eighth of the data, so reads can overlap)")
    ap.add_argument("--with-open", action="store_true",
                    help="also time the slower `with fs.open(p) as f: f.read()` loop (HEAD + GET per file)")
    ap.add_argument("--prefetch", type=int, default=4, help="ShardReader prefetch, one-process table (default %(default)s)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds of every loader (default 5, quick 3)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers for every loader (default %(default)s)")
    ap.add_argument("--batch-size", type=int, default=32, help="DataLoader batch size (default %(default)s)")
    ap.add_argument("--shuffle-buffer", type=int, default=500, help="shuffle buffer, in samples (default %(default)s)")
    ap.add_argument("--shuffle-initial", type=int, default=100,
                    help="samples buffered before the first is handed out, where a loader has that knob "
                         "(webdataset's default; default %(default)s)")
    ap.add_argument("--loaders", default="all",
                    help="comma-separated alternatives to run: webdataset,litdata,mosaicml-streaming,s3torchconnector "
                         "(default all)")
    args = ap.parse_args(argv)
    n = args.samples or (500 if args.quick else 10000)
    n_list = args.list_objects or (3000 if args.quick else 10000)
    rounds = args.rounds or (3 if args.quick else 5)
    size = args.sample_kib * 1024
    # 8 MiB: every loader's chunk/shard size, and the part size of the CRT and boto3
    # downloaders, so no loader splits an object into ranges (moto reads the whole object
    # for each range request, which would penalise whoever splits).
    shard_size = args.shard_size or "8MiB"
    fast_repeats = 5
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS["key"], AWS_SECRET_ACCESS_KEY=ACCESS["secret"],
                      AWS_DEFAULT_REGION="us-east-1")

    import s3fs

    from trainhub.data import ShardReader, pack
    from trainhub.data.listing import list_page

    t_start = time.perf_counter()
    proc, endpoint = start_moto()
    options = {"endpoint_url": endpoint, **ACCESS}
    fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, **options)
    fs.mkdir("bench")
    print(f"moto_server at {endpoint}; {n} samples x {args.sample_kib} KiB = {n * size / MiB:.0f} MiB; "
          f"shard size {shard_size}; {n_list} objects for listing", flush=True)

    blobs = {f"bench/raw/{i:06d}.jpg": os.urandom(size) for i in range(n)}
    raw_paths = sorted(blobs)
    paths = sorted(blobs)
    t_up, _ = timed(lambda: fs.pipe(blobs))
    total = sum(map(len, blobs.values()))
    tmp = tempfile.mkdtemp(prefix="trainhub-bench-")
    atexit.register(shutil.rmtree, tmp, True)
    local_paths = []
    for p, data in blobs.items():
        lp = os.path.join(tmp, os.path.basename(p))
        with open(lp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        local_paths.append(lp)
    del blobs
    print(f"uploaded in {t_up:.1f} s", flush=True)

    t_pack, shards = timed(lambda: pack("s3://bench/raw", "s3://bench/shards", shard_size=shard_size,
                                        storage_options=options, progress=False))
    print(f"packed into {len(shards)} shards in {t_pack:.1f} s ({total / MiB / t_pack:.0f} MiB/s)", flush=True)

    # -- 1. loaders side by side -------------------------------------------------------
    from trainhub.data import parse_size

    cfg = Config(endpoint, "bench", ACCESS["key"], ACCESS["secret"], args.workers, args.batch_size,
                 args.shuffle_buffer, parse_size(shard_size), tmp, shuffle_initial=args.shuffle_initial)
    wanted = None if args.loaders == "all" else {x.strip() for x in args.loaders.split(",") if x.strip()}
    trainhub_loader = TrainhubLoader(cfg, raw_paths, shards)
    trainhub_loader.prepare_seconds = t_pack
    local_loader = LocalDiskLoader(cfg, raw_paths, shards, local_paths)
    floor_loader = FloorLoader(cfg, raw_paths, shards, size)
    s3fs_loader = TrainhubS3fsLoader(cfg, raw_paths, shards)
    s3fs_loader.prepare_seconds = t_pack
    bound_loader = S3BoundLoader(cfg, raw_paths, shards, size)
    bound_loader.prepare()
    info_only = {local_loader.name, floor_loader.name, s3fs_loader.name, bound_loader.name}
    loaders = [trainhub_loader, local_loader, floor_loader, bound_loader, s3fs_loader]
    unavailable: dict[str, str] = {}
    for cls in ALTERNATIVES:
        if wanted is not None and cls.name not in wanted:
            continue
        loader = cls(cfg, raw_paths, shards)
        print(f"preparing {loader.name}...", flush=True)
        t = time.perf_counter()
        try:
            with quiet():
                loader.prepare()
        except Unavailable as e:
            unavailable[loader.name] = str(e)
            print(f"  {loader.name}: not run: {e}", flush=True)
            continue
        except Exception as e:  # a package that installs but fails against S3 here
            unavailable[loader.name] = f"preparation failed: {type(e).__name__}: {e}"
            print(f"  {loader.name}: not run: {unavailable[loader.name]}", flush=True)
            continue
        loader.prepare_seconds = time.perf_counter() - t
        print(f"  {loader.name}: prepared in {loader.prepare_seconds:.1f} s", flush=True)
        loaders.append(loader)
    side = {ld.name: [] for ld in loaders}
    for r in range(rounds):
        order = loaders[r % len(loaders):] + loaders[:r % len(loaders)]
        for loader in order:
            if loader.name in unavailable:
                continue
            try:
                loader.reset()
                t = time.perf_counter()
                with quiet():
                    keys, got = loader.epoch()
                seconds = time.perf_counter() - t
            except Exception as e:
                unavailable[loader.name] = f"reading failed: {type(e).__name__}: {e}"
                print(f"  {loader.name}: {unavailable[loader.name]}", flush=True)
                continue
            if len(keys) != n or len(set(keys)) != n or got != total:
                unavailable[loader.name] = (f"delivered {len(keys)} samples ({len(set(keys))} distinct, {got} bytes), "
                                            f"expected {n} ({total} bytes)")
                print(f"  {loader.name}: {unavailable[loader.name]}", flush=True)
                continue
            side[loader.name].append(seconds)
        print(f"  round {r + 1}/{rounds}: " + ", ".join(
            f"{name} {t[-1]:.2f}" for name, t in side.items() if t and name not in unavailable), flush=True)
    if trainhub_loader.name in unavailable:
        print(f"trainhub ShardReader failed: {unavailable[trainhub_loader.name]}")
        return 1

    def naive_cat():
        return sum(len(fs.cat_file(p)) for p in paths)

    def naive_open():
        got = 0
        for p in paths:
            with fs.open(p, "rb") as f:
                got += len(f.read())
        return got

    def shard_read(direct_http=True):
        got = count = 0
        for sample in ShardReader("s3://bench/shards", storage_options=options, prefetch=args.prefetch,
                                  direct_http=direct_http):
            got += len(sample["jpg"])
            count += 1
        assert count == n, (count, n)
        return got

    def shard_read_s3fs():
        return shard_read(direct_http=False)

    shard_paths = [fs._strip_protocol(u) for u in shards]

    def raw_shard_get():
        return sum(map(len, fs.cat(shard_paths).values()))

    def local_read():
        got = 0
        for p in local_paths:
            with open(p, "rb") as f:
                got += len(f.read())
        return got

    def local_cold():
        drop_page_cache(local_paths)
        return local_read()

    rows = []

    def check(label, got):
        assert got == total, f"{label}: read {got} bytes, expected {total}"

    # The slow per-file S3 loops run once; the fast ones run in interleaved rounds so that
    # load from other processes on the machine hits every method alike (median reported).
    slow = [("a) naive s3fs cat_file per file", naive_cat)]
    if args.with_open:
        slow.append(("   naive s3fs open().read() per file", naive_open))
    for label, fn in slow:
        seconds, got = timed(fn)
        check(label, got)
        rows.append((label, seconds, 1))
        print(f"  {label}: {seconds:.2f} s", flush=True)
    fast = {"b) ShardReader, packed shards on S3": shard_read,
            "   ShardReader, direct_http=False (info)": shard_read_s3fs,
            "   raw GET of the shard objects (info)": raw_shard_get,
            "c) local disk per file, cold cache": local_cold,
            "   local disk per file, warm cache": local_read}
    samples_by = {label: [] for label in fast}
    for _ in range(fast_repeats):
        for label, fn in fast.items():
            seconds, got = timed(fn)
            if fn is not raw_shard_get:  # shard objects also hold tar headers
                check(label, got)
            samples_by[label].append(seconds)
    for label, times in samples_by.items():
        rows.append((label, statistics.median(times), len(times)))
        print(f"  {label}: {statistics.median(times):.2f} s (runs: {', '.join(f'{t:.2f}' for t in times)})", flush=True)
    times = {label.strip(): seconds for label, seconds, _ in rows}
    t_naive = times["a) naive s3fs cat_file per file"]
    t_open = times.get("naive s3fs open().read() per file")
    t_shard = times["b) ShardReader, packed shards on S3"]
    t_get = times["raw GET of the shard objects (info)"]
    t_cold = times["c) local disk per file, cold cache"]
    t_warm = times["local disk per file, warm cache"]

    # -- listing -----------------------------------------------------------------------
    tiny = {f"bench/list/obj-{i:06d}": b"x" for i in range(n_list)}
    t_lup, _ = timed(lambda: fs.pipe(tiny))
    del tiny

    def raw_ls():
        return len(fs.ls("bench/list", refresh=True))

    def walk(limit):
        def run():
            count, after = 0, None
            while True:
                page = list_page(fs, "bench/list", limit=limit, after=after)
                count += len(page)
                if page.next_after is None:
                    return count
                after = page.next_after
        return run

    ls_times, walk_times = [], []
    list_repeats = 3
    for _ in range(list_repeats):
        seconds, c_ls = timed(raw_ls)
        ls_times.append(seconds)
        seconds, c_walk = timed(walk(1000))
        walk_times.append(seconds)
    t_ls, t_walk = statistics.median(ls_times), statistics.median(walk_times)
    t_first, _ = timed(lambda: len(list_page(fs, "bench/list", limit=100)), list_repeats)
    t_deep, _ = timed(lambda: len(list_page(fs, "bench/list", limit=100, after=f"bench/list/obj-{n_list - 150:06d}")),
                      list_repeats)
    assert c_ls == c_walk == n_list, (c_ls, c_walk, n_list)

    # -- report ------------------------------------------------------------------------
    print()
    med = {name: statistics.median(t) for name, t in side.items() if t and name not in unavailable}
    t_th = med[trainhub_loader.name]
    print(f"Loaders side by side: {n} samples x {args.sample_kib} KiB ({total / MiB:.0f} MiB) from moto S3 on loopback; "
          f"DataLoader workers={args.workers}, batch={args.batch_size}, shuffle buffer={args.shuffle_buffer} "
          f"(initial {cfg.shuffle_initial}; {args.shuffle_buffer * max(args.workers, 1) / n:.0%} of the epoch held in the "
          f"buffers), "
          f"shard/chunk size {shard_size}; median of {rounds} interleaved rounds, cache emptied before each")
    print(f"{'loader':<24} {'version':<10} {'prepare s':>9} {'epoch s':>8} {'MiB/s':>7} {'trainhub x':>10}  runs / notes")
    for loader in loaders:
        name = loader.name
        try:
            version = loader.version()
        except Unavailable:
            version = "-"
        prep = "-" if loader in (local_loader, floor_loader, bound_loader) else f"{loader.prepare_seconds:.1f}"
        if name in med:
            runs = ", ".join(f"{x:.2f}" for x in side[name])
            print(f"{name:<24} {version:<10} {prep:>9} {med[name]:>8.2f} {total / MiB / med[name]:>7.0f} "
                  f"{med[name] / t_th:>9.2f}x  {runs}; {loader.note}")
    for name, why in unavailable.items():
        print(f"{name:<24} not run: {why}")
    print("(trainhub x = that loader's median time / trainhub's: above 1 means trainhub is faster)")
    alternatives = {name: t for name, t in med.items() if name != trainhub_loader.name and name not in info_only}
    print()
    print(f"One process (no DataLoader), {n} samples x {args.sample_kib} KiB ({total / MiB:.0f} MiB), moto S3 on loopback")
    print(f"{'method':<40} {'runs':>4} {'seconds':>8} {'MiB/s':>8} {'samples/s':>10}")
    for label, seconds, repeats in rows:
        print(f"{label:<40} {repeats:>4} {seconds:>8.2f} {total / MiB / seconds:>8.1f} {n / seconds:>10.0f}")
    print("(runs > 1: median shown)")
    print()
    print(f"Listing {n_list} objects (uploaded in {t_lup:.1f} s)")
    print(f"{'method (median of ' + str(list_repeats) + ' runs)':<40} {'seconds':>8}")
    print(f"{'raw s3fs.ls(refresh=True)':<40} {t_ls:>8.3f}")
    print(f"{'list_page walk, limit=1000':<40} {t_walk:>8.3f}")
    print(f"{'list_page first page, limit=100':<40} {t_first:>8.3f}")
    print(f"{'list_page deep page, limit=100':<40} {t_deep:>8.3f}")
    print()
    checks = []
    if alternatives:
        best = min(alternatives, key=alternatives.get)
        checks.append((f"ShardReader / best loader ({best})", alternatives[best] / t_th, ">=", 1.0))
        for name in sorted(alternatives):
            if name != best:
                checks.append((f"ShardReader / {name} (info)", alternatives[name] / t_th, None, None))
    else:
        checks.append(("ShardReader / best loader (none ran)", 0.0, ">=", 1.0))
    checks += [
        ("ShardReader / local disk cold (same harness)", med[local_loader.name] / t_th, ">=", 1.0),
        ("ShardReader / floor, bytes from memory (info)", med[floor_loader.name] / t_th, None, None),
        ("ShardReader / bound, shard GETs only (info)", med.get(bound_loader.name, 0.0) / t_th, None, None),
        ("bound, shard GETs only / local disk cold (info)",
         med[local_loader.name] / med[bound_loader.name] if bound_loader.name in med else 0.0, None, None),
        ("ShardReader / itself via s3fs, direct_http=False (info)", med.get(s3fs_loader.name, 0.0) / t_th, None, None),
        ("shards / naive cat_file (one process)", t_naive / t_shard, ">=", 10.0),
        ("shards / local disk cold (one process, info)", t_cold / t_shard, None, None),
        ("shards / local disk warm (info)", t_warm / t_shard, None, None),
        ("shards / raw GET of shard objects (info)", t_get / t_shard, None, None),
        ("list_page walk / raw ls", t_walk / t_ls, "<=", 1.2),
    ]
    if t_open is not None:
        checks.insert(1, ("shards / naive open().read()", t_open / t_shard, ">=", 10.0))
    ok = True
    print(f"{'ratio (speed-up; listing: time ratio)':<56} {'value':>8}  target   result")
    for label, value, op, target in checks:
        if op is None:
            print(f"{label:<56} {value:>7.2f}x  -        -")
            continue
        passed = value >= target if op == ">=" else value <= target
        ok &= passed
        print(f"{label:<56} {value:>7.2f}x  {op} {target:<4}  {'PASS' if passed else 'FAIL'}")
    print()
    print(f"overall: {'PASS' if ok else 'FAIL'} (total {time.perf_counter() - t_start:.0f} s; "
          f"what the loaders printed: {LOADER_LOG})")
    stop(proc)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
