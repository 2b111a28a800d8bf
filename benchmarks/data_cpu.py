#!/usr/bin/env python
"""Where an epoch's CPU goes, for ShardReader beside the cold local disk (info, no target).

    .venv/bin/python benchmarks/data_cpu.py [--samples 2000] [--rounds 6] [--buffers 500:100,0]

The same moto server, samples, shards, DataLoader (2 workers, batch 32) and loaders as
data_bench.py (benchmarks/data_loaders.py), in interleaved rounds; for each epoch the CPU
seconds of the main process, of the DataLoader workers (reaped children) and of moto, and the
workers' minor page faults. ``--buffers`` lists ShardReader's ``shuffle_buffer:shuffle_initial``
settings to run (``0``: no shuffle buffer, shards in shuffled order, samples in stored order:
the least CPU any reading of these shards through this harness takes).

Why it exists: on a loaded machine every process gets a share of the cores, so an epoch takes
about its CPU seconds divided by that share, and the loader with less CPU per epoch wins
whatever its order of reading. The cold disk's reads are I/O done outside these cores; the S3
server's work is not. What it leaves out: the kernel's work for the disk outside the workers'
own system time, and everything else on the machine (its load average is printed).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

from data_bench import ACCESS, start_moto, stop
from data_loaders import Config, FloorLoader, LocalDiskLoader, TrainhubLoader, _data_loader, _drain


class _TrainhubBuffer(TrainhubLoader):
    """ShardReader with a given shuffle buffer (``buffer=0``: none)."""

    def __init__(self, cfg, raw_paths, shard_urls, buffer: int, initial: int | None):
        super().__init__(cfg, raw_paths, shard_urls)
        self.buffer, self.initial = buffer, initial
        self.name = (f"ShardReader buffer {buffer}, initial {initial}" if buffer else
                     "ShardReader, no shuffle buffer")

    def epoch(self):
        from trainhub.data import TorchShardDataset

        ds = TorchShardDataset(f"s3://{self.cfg.bucket}/shards", shuffle_buffer=self.buffer,
                               shuffle_initial=self.initial if self.buffer else None, seed=self.cfg.seed,
                               storage_options=self.cfg.storage_options)
        return _drain(_data_loader(ds, self.cfg))


def _cpu(pid: int) -> tuple[float, float, float, int]:
    """(main, reaped children, pid) CPU seconds and the children's minor faults so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    server = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, server, kids.ru_minflt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2000, help="100 KiB samples (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--buffers", default="500:100,0",
                    help="ShardReader shuffle_buffer:shuffle_initial settings, comma-separated (default %(default)s)")
    args = ap.parse_args(argv)
    n, size = args.samples, 100 * 1024
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS["key"], AWS_SECRET_ACCESS_KEY=ACCESS["secret"],
                      AWS_DEFAULT_REGION="us-east-1")
    import s3fs

    from trainhub.data import pack, parse_size

    proc, endpoint = start_moto()
    options = {"endpoint_url": endpoint, **ACCESS}
    fs = s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True, **options)
    fs.mkdir("bench")
    blobs = {f"bench/raw/{i:06d}.jpg": os.urandom(size) for i in range(n)}
    fs.pipe(blobs)
    tmp = tempfile.mkdtemp(prefix="trainhub-cpu-")
    local = []
    for p, data in blobs.items():
        lp = os.path.join(tmp, os.path.basename(p))
        with open(lp, "wb") as f:
            f.write(data)
        local.append(lp)
    os.sync()
    raw = sorted(blobs)
    del blobs
    shards = pack("s3://bench/raw", "s3://bench/shards", shard_size="8MiB", storage_options=options, progress=False)
    cfg = Config(endpoint, "bench", ACCESS["key"], ACCESS["secret"], 2, 32, 500, parse_size("8MiB"), tmp,
                 shuffle_initial=100)
    disk = LocalDiskLoader(cfg, raw, shards, local)
    loaders = [disk, FloorLoader(cfg, raw, shards, size)]
    for spec in args.buffers.split(","):
        buffer, _, initial = spec.partition(":")
        loaders.append(_TrainhubBuffer(cfg, raw, shards, int(buffer), int(initial) if initial else None))
    wall = {ld.name: [] for ld in loaders}
    cpu = {ld.name: [] for ld in loaders}
    loads = []
    for r in range(args.rounds):
        for loader in loaders[r % len(loaders):] + loaders[:r % len(loaders)]:
            loader.reset()
            before = _cpu(proc.pid)
            t = time.perf_counter()
            keys, got = loader.epoch()
            wall[loader.name].append(time.perf_counter() - t)
            cpu[loader.name].append([b - a for a, b in zip(before, _cpu(proc.pid))])
            assert len(keys) == n and len(set(keys)) == n and got == n * size, (loader.name, len(keys), got)
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.rounds} (load average {loads[-1]:.1f}): "
              + ", ".join(f"{k} {v[-1]:.2f}" for k, v in wall.items()), flush=True)
    stop(proc)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{n} samples x 100 KiB, 2 workers, batch 32, 8 MiB shards; medians of {args.rounds} interleaved rounds; "
          f"load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'loader':<36} {'epoch s':>7} {'disk/this':>9} {'main':>6} {'workers':>7} {'moto':>6} {'CPU s':>6} "
          f"{'faults':>7}")
    for name in wall:
        per_round = statistics.median(d / t for d, t in zip(wall[disk.name], wall[name]))
        main_s, workers, server, faults = (statistics.median(c[i] for c in cpu[name]) for i in range(4))
        print(f"{name:<36} {statistics.median(wall[name]):>7.2f} {per_round:>8.2f}x {main_s:>6.3f} {workers:>7.3f} "
              f"{server:>6.3f} {main_s + workers + server:>6.3f} {faults:>7.0f}")
    print("(disk/this: median of the per-round ratios, above 1 means faster than the cold disk; CPU in CPU-seconds "
          "per epoch; moto's is the S3 server's, 0 for loaders that do not use it; faults: the workers' minor page "
          "faults)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
