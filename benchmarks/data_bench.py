#!/usr/bin/env python
"""Benchmark trainhub.data against naive per-file reads, on a real (moto) S3 server.

    .venv/bin/python benchmarks/data_bench.py [--quick]

Starts ``moto_server`` on a free loopback port, uploads N x 100 KiB samples and measures:

  a) naive: one s3fs request per file (``fs.cat_file(path)`` in a loop; the baseline),
     with ``--with-open`` also the common ``with fs.open(path) as f: f.read()`` loop (HEAD + GET);
  b) the same samples packed into tar shards, read back through ``ShardReader`` from S3
     (and, for reference, a plain concurrent GET of the shard objects: the store's limit);
  c) the same bytes read file by file from local disk, cold (pages dropped from the page
     cache with posix_fadvise before reading) and, for reference, warm.

Then lists 10,000 objects with raw ``s3fs.ls`` and with ``trainhub.data.listing.list_page``
(every page of 1,000, which is what a client walking the whole folder pays).

Targets: shards / naive >= 10x; shards / local cold >= 0.5x; list_page walk / raw ls <= 1.2x.
Exit status 0 when all targets pass, 1 otherwise. moto is CPU-bound and shares the machine
with the benchmark, so absolute numbers understate a real object store; ratios are the point.
"""

from __future__ import annotations

import argparse
import atexit
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


def drop_page_cache(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples and objects (about 30 s)")
    ap.add_argument("--samples", type=int, help="number of samples (default 2000, quick 500)")
    ap.add_argument("--sample-kib", type=int, default=100, help="sample size in KiB (default %(default)s)")
    ap.add_argument("--list-objects", type=int, help="objects for the listing test (default 10000, quick 3000)")
    ap.add_argument("--shard-size", default=None,
                    help="shard size for pack (default: an eighth of the data, so reads can overlap)")
    ap.add_argument("--with-open", action="store_true",
                    help="also time the slower `with fs.open(p) as f: f.read()` loop (HEAD + GET per file)")
    ap.add_argument("--prefetch", type=int, default=4, help="ShardReader prefetch (default %(default)s)")
    args = ap.parse_args(argv)
    n = args.samples or (500 if args.quick else 2000)
    n_list = args.list_objects or (3000 if args.quick else 10000)
    size = args.sample_kib * 1024
    shard_size = args.shard_size or f"{max(1, n * size // 8 // MiB)}MiB"
    fast_repeats = 5

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

    def naive_cat():
        return sum(len(fs.cat_file(p)) for p in paths)

    def naive_open():
        got = 0
        for p in paths:
            with fs.open(p, "rb") as f:
                got += len(f.read())
        return got

    def shard_read():
        got = count = 0
        for sample in ShardReader("s3://bench/shards", storage_options=options, prefetch=args.prefetch):
            got += len(sample["jpg"])
            count += 1
        assert count == n, (count, n)
        return got

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
    print(f"Throughput, {n} samples x {args.sample_kib} KiB ({total / MiB:.0f} MiB), moto S3 on loopback")
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
    checks = [
        ("shards / naive cat_file", t_naive / t_shard, ">=", 10.0),
        ("shards / local disk cold", t_cold / t_shard, ">=", 0.5),
        ("shards / local disk warm (info)", t_warm / t_shard, None, None),
        ("shards / raw GET of shard objects (info)", t_get / t_shard, None, None),
        ("list_page walk / raw ls", t_walk / t_ls, "<=", 1.2),
    ]
    if t_open is not None:
        checks.insert(1, ("shards / naive open().read()", t_open / t_shard, ">=", 10.0))
    ok = True
    print(f"{'ratio (speed-up; listing: time ratio)':<40} {'value':>8}  target   result")
    for label, value, op, target in checks:
        if op is None:
            print(f"{label:<40} {value:>7.2f}x  -        -")
            continue
        passed = value >= target if op == ">=" else value <= target
        ok &= passed
        print(f"{label:<40} {value:>7.2f}x  {op} {target:<4}  {'PASS' if passed else 'FAIL'}")
    print()
    print(f"overall: {'PASS' if ok else 'FAIL'} (total {time.perf_counter() - t_start:.0f} s)")
    stop(proc)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
