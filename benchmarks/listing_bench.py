#!/usr/bin/env python
"""Benchmark the side panel's storage listing against a raw s3fs ``ls``, on a real (moto) S3 server.

    .venv/bin/python benchmarks/listing_bench.py [--objects 10000] [--repeat 5]

Starts ``moto_server`` and a real ``jupyter server`` with the ``trainhub.extensions.storage``
extension (the user's area on that bucket, exactly as a spawned server gets it), puts N
objects in one folder of the user's area and measures, each ``--repeat`` times (median):

  a) raw: ``s3fs.S3FileSystem.ls(folder, detail=True, refresh=True)`` in this process
     (one paginated ListObjectsV2 walk; the baseline);
  b) panel: every page of the folder through the extension's HTTP API
     (``GET trainhub/storage/list?limit=1000&after=...``), JSON decoded: what the panel pays
     to walk all N entries ("Load more" to the end);
  c) for reference: the panel's first page (200 entries, what opening the folder costs).

Target: b / a <= 1.2. Exit status 0 when it holds, 1 otherwise. moto is CPU-bound and shares
the machine with both processes, so absolute numbers understate a real object store.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import requests

from trainhub.backoff import WaitTimeout, poll

TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc, timeout=60, headers=None):
    def answers() -> bool:
        try:
            if requests.get(url, timeout=2, headers=headers).status_code < 500:
                return True
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{url} did not come up")
        return False

    try:
        poll(answers, what=f"{url} to answer", start=0.2, factor=1.0, timeout=timeout)
    except WaitTimeout:
        raise SystemExit(f"{url} did not come up") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--page", type=int, default=1000, help="panel page size for the full walk (default 1000)")
    args = ap.parse_args(argv)

    import s3fs

    procs = []
    try:
        moto_port = free_port()
        env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
        exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
        moto = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(moto_port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(moto)
        endpoint = f"http://127.0.0.1:{moto_port}"
        wait_http(endpoint + "/moto-api/", moto)
        opts = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
        fs = s3fs.S3FileSystem(**opts, use_listings_cache=False)
        fs.mkdir("bench")
        folder = "bench/root/users/alice/big"
        t0 = time.perf_counter()
        fs.pipe({f"{folder}/sample-{i:06d}.jpg": b"x" * 100 for i in range(args.objects)})
        fs.pipe("bench/root/datasets/.keep", b"")
        print(f"put {args.objects} objects in {time.perf_counter() - t0:.1f} s")

        work = tempfile.mkdtemp(prefix="listing-bench-")
        port = free_port()
        senv = dict(env, TRAINHUB_STORAGE_URL="s3://bench/root/users/alice", TRAINHUB_DATASETS_URL="s3://bench/root/datasets",
                    TRAINHUB_STORAGE_OPTIONS=json.dumps(opts), JUPYTER_CONFIG_DIR=f"{work}/config",
                    JUPYTER_RUNTIME_DIR=f"{work}/runtime")
        cmd = [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser",
               f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={work}", "--log-level=WARN",
               '--ServerApp.jpserver_extensions={"trainhub.extensions.storage": True}']
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        server = subprocess.Popen(cmd, env=senv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(server)
        base = f"http://127.0.0.1:{port}/trainhub/storage"
        session = requests.Session()
        session.headers["Authorization"] = f"token {TOKEN}"
        wait_http(base + "/areas", server, headers=dict(session.headers))

        def raw():
            return len(fs.ls(folder, detail=True, refresh=True))

        def panel_walk():
            n, after = 0, None
            while True:
                params = {"area": "home", "path": "big", "limit": args.page}
                if after:
                    params["after"] = after
                r = session.get(base + "/list", params=params, timeout=120)
                r.raise_for_status()
                body = r.json()
                n += len(body["entries"])
                after = body["next_after"]
                if not after:
                    return n

        def panel_first():
            r = session.get(base + "/list", params={"area": "home", "path": "big", "limit": 200}, timeout=60)
            r.raise_for_status()
            return len(r.json()["entries"])

        assert raw() == args.objects and panel_walk() == args.objects  # warm-up and check
        results = {}
        for name, fn in (("raw", raw), ("panel", panel_walk), ("first", panel_first)):
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            results[name] = times
        # interleave a second round so drift in moto's speed hits both sides alike
        for _ in range(args.repeat):
            for name, fn in (("raw", raw), ("panel", panel_walk)):
                t = time.perf_counter()
                fn()
                results[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in results.items()}
        ratio = med["panel"] / med["raw"]
        print(f"raw s3fs ls of {args.objects} objects:            median {med['raw']:.3f} s  "
              f"(min {min(results['raw']):.3f}, max {max(results['raw']):.3f}, n={len(results['raw'])})")
        print(f"panel listing, all pages of {args.page} via HTTP:      median {med['panel']:.3f} s  "
              f"(min {min(results['panel']):.3f}, max {max(results['panel']):.3f}, n={len(results['panel'])})")
        print(f"panel first page (200 entries):                  median {med['first']:.3f} s")
        ok = ratio <= 1.2
        print(f"panel / raw = {ratio:.2f}x (target <= 1.2x): {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
