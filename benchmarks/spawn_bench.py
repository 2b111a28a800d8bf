"""Spawn-to-ready: trainhub's LocalGPUSpawner against stock JupyterHub's SimpleLocalProcessSpawner.

One run starts both, on this machine, with the same proxy and the same single-user
command, and alternates spawns between them (so a neighbour's load hits both alike):

* trainhub: a real `trainhub up --gpus 4` (simulated devices without a driver), each spawn
  with ``{"profile": "gpu-1"}`` (so the ledger, quota and storage work are in the measure);
* stock: a plain ``jupyterhub`` with ``SimpleLocalProcessSpawner`` and a minimal config. Its
  single-user servers run from the same virtualenv, where `trainhub up` enables trainhub's
  storage server extension and lab extension for every server; the stock servers get their
  own ``JUPYTER_CONFIG_DIR`` that turns every trainhub extension off, and the benchmark
  checks the stock server's log for the extensions it loaded (none of trainhub's, jupyterlab
  present) before timing anything.

Each measure is the time from the spawn POST to the hub reporting the server ``ready``
(polled every 50 ms through the REST API); the server is stopped between spawns. One
untimed warm-up spawn runs on each first. Before each spawn (and each rush wave) the benchmark waits until
trainhub's warm pool has stopped importing, so that neither hub's spawns pay for its refills. Prints both
medians and the ratio; PASS when
trainhub's median is at most 0.5 x stock's (warm servers: LocalGPUSpawner.warm_start).

Then the rush (``--rush-users``, 0 skips it): 10 users ask for a server within one minute
(arrival times drawn uniformly over 60 s with a fixed seed), each server kept until the
whole wave is ready, then all stopped; a second wave of the same users (new draw) follows
once the first wave's servers have stopped (the team back from a break: the hub must have
refilled what the first wave took, and 20 running servers per hub do not fit beside the
neighbours on 2 shared cores). Each wave runs on one hub at a time (trainhub then stock in
the first wave, stock then trainhub in the second), profile ``cpu`` on trainhub (10 users,
4 simulated GPUs). Prints every rush spawn, its ratio to stock's rush median and whether it
was a pool hit (from the hub's log); PASS when every trainhub rush spawn is at most 0.5 x
stock's median rush spawn. Exit status 0 when both targets pass, 1 otherwise.

    .venv/bin/python benchmarks/spawn_bench.py [--spawns N] [--target 0.5] [--rush-users 10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from trainhub.app import up
from trainhub.backoff import WaitTimeout, poll
from trainhub.settings import DataDir
from trainhub.extensions import LABEXTENSION_NAME, SERVER_EXTENSION

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    try:
        up.wait_http(url, proc, what, timeout)
    except up.UpError as e:
        raise SystemExit(str(e)) from None


class Hub:
    """A running hub: base URL, an admin-scoped token, and a process to stop."""

    def __init__(self, name: str, url: str, token: str, proc: subprocess.Popen, body: dict, log: Path,
                 rush_body: dict | None = None):
        self.name, self.url, self.token, self.proc, self.body, self.log = name, url, token, proc, body, log
        self.rush_body = body if rush_body is None else rush_body
        self.s = requests.Session()
        self.s.headers["Authorization"] = f"token {token}"

    def api(self, method, path, **kw):
        kw.setdefault("timeout", 60)
        return self.s.request(method, f"{self.url}/hub/api{path}", **kw)

    def ensure_user(self, user: str) -> None:
        if self.api("GET", f"/users/{user}").status_code == 404:
            r = self.api("POST", f"/users/{user}")
            r.raise_for_status()

    def spawn_to_ready(self, user: str, timeout: float = 180) -> float:
        t0 = time.perf_counter()
        r = self.api("POST", f"/users/{user}/server", json=self.body)
        if r.status_code not in (201, 202):
            raise SystemExit(f"{self.name}: spawn refused: {r.status_code} {r.text[:300]}")
        try:
            poll(lambda: (self.api("GET", f"/users/{user}").json().get("servers") or {}).get(""),
                 lambda server: server and server.get("ready"), what=f"{self.name}: {user}'s server to be ready",
                 start=0.05, factor=1.0, timeout=timeout)
        except WaitTimeout:
            raise SystemExit(f"{self.name}: server not ready within {timeout} s") from None
        return time.perf_counter() - t0

    def stop_server(self, user: str, timeout: float = 60) -> None:
        self.api("DELETE", f"/users/{user}/server")
        try:
            poll(lambda: (self.api("GET", f"/users/{user}").json().get("servers") or {}).get(""), lambda server: not server,
                 what=f"{self.name}: {user}'s server to stop", start=0.1, factor=1.0, timeout=timeout)
        except WaitTimeout:
            raise SystemExit(f"{self.name}: server did not stop within {timeout} s") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def env_with_venv() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
    env.pop("TRAINHUB_DATA_DIR", None)
    return env


def start_trainhub(tmp: Path) -> Hub:
    data = tmp / "trainhub"
    port = free_port()
    log = open(tmp / "trainhub-up.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainhub.cli", "up", "--data-dir", str(data), "--gpus", "4", "--port", str(port), "--quiet"],
        stdout=log, stderr=subprocess.STDOUT, env=env_with_venv(), start_new_session=True, cwd=str(REPO),
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/hub/api/", proc, "trainhub up")
    r = subprocess.run([sys.executable, "-m", "trainhub.cli", "token", "admin", "--admin", "--data-dir", str(data)],
                       capture_output=True, text=True, env=env_with_venv(), check=True)
    return Hub("trainhub LocalGPUSpawner", url, r.stdout.strip().splitlines()[-1], proc, {"profile": "gpu-1"},
               data / "logs" / "jupyterhub.log", rush_body={"profile": "cpu"})


STOCK_CONFIG = """
import sys
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{root}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{root}/cookie_secret"
c.JupyterHub.pid_file = "{root}/jupyterhub.pid"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{root}/homes/{{username}}"
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]  # the same command trainhub uses
# limits no spawn reaches on a quiet machine; under a rush on a loaded one JupyterHub's defaults (http_timeout 30 s)
# failed stock spawns whose server was only slow (jupyterlab's import runs `yarn config` through node)
c.Spawner.http_timeout = 180
c.Spawner.start_timeout = 180
c.Spawner.default_url = "/lab"
c.Spawner.args = {args!r}
c.Spawner.environment = {{"JUPYTER_CONFIG_DIR": {jupyter_config!r}}}  # no trainhub extension (see clean_jupyter_config)
c.JupyterHub.services = [{{"name": "bench", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "bench", "scopes": ["admin:users", "admin:servers"], "services": ["bench"]}}]
"""


def find_proxy(root: Path) -> str:
    """The proxy `trainhub up` would use (the same lookup: $TRAINHUB_PROXY_CMD, PATH, the venv's npm install)."""
    try:
        return up.find_proxy(DataDir(root), install=False)
    except up.UpError as e:
        raise SystemExit(str(e)) from None


def clean_jupyter_config(root: Path) -> Path:
    """A JUPYTER_CONFIG_DIR that turns off every trainhub extension this environment enables.

    ``trainhub up`` enables the storage server extension in ``<venv>/etc/jupyter`` and installs
    the lab extension in ``<venv>/share/jupyter``, which every server started from this
    virtualenv would load. The user config dir has the highest priority, so setting
    ``jpserver_extensions`` to false there (and disabling the lab extension in
    ``labconfig/page_config.json``) gives the stock servers a stock Jupyter.
    """
    server = {SERVER_EXTENSION: False}
    for conf in (Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.d").glob("*.json"):
        try:
            enabled = json.loads(conf.read_text()).get("ServerApp", {}).get("jpserver_extensions", {})
        except ValueError:
            continue
        server.update({name: False for name in enabled if name.split(".")[0] == "trainhub"})
    lab = {LABEXTENSION_NAME: True}
    labext = Path(sys.prefix) / "share" / "jupyter" / "labextensions"
    if labext.is_dir():
        lab.update({p.name: True for p in labext.iterdir() if p.name.startswith("trainhub")})
    cfg = root / "jupyter-config"
    (cfg / "labconfig").mkdir(parents=True)
    (cfg / "jupyter_server_config.json").write_text(json.dumps({"ServerApp": {"jpserver_extensions": server}}, indent=1))
    (cfg / "labconfig" / "page_config.json").write_text(json.dumps({"disabledExtensions": lab}, indent=1))
    return cfg


LOADED = re.compile(r"(\S+) \| extension was successfully loaded")


def check_stock_is_clean(log: Path) -> list[str]:
    """The server extensions the stock hub's single-user servers loaded; exit if any is trainhub's."""
    loaded = sorted(set(LOADED.findall(log.read_text(errors="replace"))))
    if "jupyterlab" not in loaded:
        raise SystemExit(f"cannot tell which extensions the stock server loaded: no 'jupyterlab | extension was "
                         f"successfully loaded' line in {log} (run with --keep to look)")
    ours = [name for name in loaded if name.split(".")[0] == "trainhub"]
    if ours:
        raise SystemExit(f"the stock hub's single-user server loaded trainhub extension(s) {ours}: not a stock baseline")
    return loaded


def start_stock(tmp: Path) -> Hub:
    root = tmp / "stock"
    (root / "homes").mkdir(parents=True)
    port, token = free_port(), secrets.token_hex(16)
    cfg = root / "jupyterhub_config.py"
    cfg.write_text(STOCK_CONFIG.format(
        port=port, hub_port=free_port(), proxy_port=free_port(), proxy=find_proxy(root), root=root, token=token,
        args=["--allow-root"] if os.geteuid() == 0 else [], jupyter_config=str(clean_jupyter_config(root)),
    ))
    log = open(tmp / "stock-jupyterhub.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                            env=env_with_venv(), cwd=str(root), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/hub/api/", proc, "stock jupyterhub")
    return Hub("stock SimpleLocalProcessSpawner", url, token, proc, {}, tmp / "stock-jupyterhub.log")


HIT = re.compile(r"Spawning (\S+) from warm interpreter")
MISS = re.compile(r"\] (\S+) starts cold: (.*)$", re.M)


def pool_outcomes(log: Path, since: int) -> dict[str, str]:
    """What the hub's log says of each spawn after byte ``since``: "hit" (claimed a warm interpreter) or "miss: why"."""
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    seen = {user: "hit" for user in HIT.findall(text)}
    for user, why in MISS.findall(text):
        seen.setdefault(user, f"miss: {why.strip()}")
    return seen


def pool_cpu() -> float:
    """CPU seconds used so far by every warm interpreter of trainhub's pool on this machine (their command line stays
    ``python -m trainhub.spawner.warmstart``, claimed or not: call it while no trainhub server runs)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"trainhub.spawner.warmstart" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def settle_pool(limit: float = 90.0) -> float:
    """Wait until trainhub's pool is not importing (its interpreters used under 0.05 CPU s in the last 0.5 s), so that
    a refill never runs beside a spawn it is not part of: stock's spawns would pay for trainhub's pool otherwise.
    Returns the seconds waited."""
    began = time.perf_counter()
    last = pool_cpu()
    while time.perf_counter() - began < limit:
        time.sleep(0.5)
        now = pool_cpu()
        if now - last < 0.05:
            break
        last = now
    return time.perf_counter() - began


def arrivals(users: int, window: float, seed: int) -> list[float]:
    """Seconds after the wave's start at which each user asks: uniform over ``window``, a fixed draw per seed."""
    rng = random.Random(seed)
    return sorted(rng.uniform(0, window) for _ in range(users))


def rush_wave(hub: Hub, users: list[str], offsets: list[float], timeout: float = 300) -> dict[str, float]:
    """Each user POSTs a spawn at its offset (one thread each); one poll of the user list every 0.1 s sees each server
    ready (ten pollers at 50 ms would load the hub they measure). Returns spawn POST -> ready seconds per user. All
    servers are stopped before it returns."""
    for user in users:
        hub.ensure_user(user)
    asked: dict[str, float] = {}
    errors: list[str] = []
    start = time.perf_counter()

    def ask(user: str, at: float) -> None:
        time.sleep(max(0.0, start + at - time.perf_counter()))
        asked[user] = time.perf_counter()
        r = hub.api("POST", f"/users/{user}/server", json=hub.rush_body, timeout=120)
        if r.status_code not in (201, 202):
            errors.append(f"{user}: {r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=ask, args=(u, at), daemon=True) for u, at in zip(users, offsets)]
    for t in threads:
        t.start()
    ready: dict[str, float] = {}
    deadline = start + max(offsets) + timeout
    while len(ready) < len(users) and not errors and time.perf_counter() < deadline:
        r = hub.api("GET", "/users")
        now = time.perf_counter()
        for model in r.json() if r.ok else []:
            server = (model.get("servers") or {}).get("")
            if model["name"] in asked and model["name"] not in ready and server and server.get("ready"):
                ready[model["name"]] = now - asked[model["name"]]
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=120)
    stoppers = [threading.Thread(target=hub.stop_server, args=(u,), daemon=True) for u in users]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join(timeout=120)
    if errors or len(ready) < len(users):
        raise SystemExit(f"{hub.name}: rush spawns failed: {errors or sorted(set(users) - set(ready))} (run with --keep)")
    return ready


def run_rush(hubs: list[Hub], args) -> tuple[dict, dict]:
    """Both waves on both hubs (one hub at a time, the order reversed in the second wave). Returns per hub the list of
    (wave, user, arrival offset, seconds), and trainhub's pool outcome per (wave, user)."""
    users = [f"rush{i + 1:02d}" for i in range(args.rush_users)]
    times: dict[str, list] = {h.name: [] for h in hubs}
    outcomes: dict[tuple[int, str], str] = {}
    for wave in range(args.rush_waves):
        offsets = arrivals(args.rush_users, args.rush_window, args.rush_seed + wave)
        for hub in (hubs if wave % 2 == 0 else hubs[::-1]):
            since = hub.log.stat().st_size
            waited = settle_pool()
            print(f"  rush wave {wave + 1}: {hub.name.split()[0]}, {args.rush_users} users over {args.rush_window:.0f} s "
                  f"(after {waited:.1f} s for trainhub's pool to stop importing)...", flush=True)
            took = rush_wave(hub, users, offsets)
            times[hub.name] += [(wave + 1, u, at, took[u]) for u, at in zip(users, offsets)]
            if hub is hubs[0]:
                seen = pool_outcomes(hub.log, since)
                outcomes.update({(wave + 1, u): seen.get(u, "not in the log") for u in users})
    return times, outcomes


def report_rush(hubs: list[Hub], times: dict, outcomes: dict, target: float) -> bool:
    trainhub, stock = hubs
    stock_median = statistics.median(t for *_, t in times[stock.name])
    stock_by = {(w, u): t for w, u, _, t in times[stock.name]}
    print()
    print(f"rush: {len(times[trainhub.name])} spawns per hub; stock's median rush spawn {stock_median:.2f} s")
    print(f"{'wave':>4} {'user':7} {'asks at':>8} {'trainhub':>9} {'/stock median':>14} {'stock':>7}  pool")
    worst = 0.0
    for w, u, at, t in times[trainhub.name]:
        ratio = t / stock_median
        worst = max(worst, ratio)
        print(f"{w:>4} {u:7} {at:7.1f}s {t:8.2f}s {ratio:13.3f}  {stock_by[(w, u)]:6.2f}s  {outcomes[(w, u)]}")
    for hub in hubs:
        for w in sorted({w for w, *_ in times[hub.name]}):
            ts = [t for ww, _, _, t in times[hub.name] if ww == w]
            print(f"{hub.name:34} wave {w}: median {statistics.median(ts):6.2f} s, max {max(ts):6.2f} s")
    misses = [(w, u, o) for (w, u), o in sorted(outcomes.items()) if o != "hit"]
    print(f"pool: {len(outcomes) - len(misses)} hits, {len(misses)} misses of {len(outcomes)} trainhub rush spawns")
    for w, u, o in misses:
        print(f"  wave {w} {u}: {o}")
    ok = worst <= target
    print(f"rush: worst trainhub spawn / stock's median rush spawn = {worst:.3f} (target: each <= {target:.2f}): "
          f"{'PASS' if ok else 'FAIL'}")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spawns", type=int, default=9, help="timed spawns per spawner (default 9)")
    ap.add_argument("--target", type=float, default=0.5, help="largest acceptable trainhub/stock ratio (default 0.5)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs) and print its path")
    ap.add_argument("--rush-users", type=int, default=10, help="users of each rush wave (default 10; 0: no rush)")
    ap.add_argument("--rush-window", type=float, default=60.0, help="seconds over which a wave's users ask (default 60)")
    ap.add_argument("--rush-waves", type=int, default=2, help="rush waves (default 2)")
    ap.add_argument("--rush-seed", type=int, default=35, help="seed of the first wave's arrival times (default 35)")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="spawn-bench-"))
    hubs: list[Hub] = []
    try:
        print("starting trainhub up and a stock jupyterhub...", flush=True)
        hubs = [start_trainhub(tmp), start_stock(tmp)]
        for hub in hubs:
            hub.ensure_user("bench")
            hub.spawn_to_ready("bench")  # warm-up: imports, home folder, first proxy route
            hub.stop_server("bench")
        stock_extensions = check_stock_is_clean(tmp / "stock-jupyterhub.log")
        print("stock single-user server loaded: " + ", ".join(stock_extensions) + " (no trainhub extension)", flush=True)
        times: dict[str, list[float]] = {h.name: [] for h in hubs}
        settled = 0.0
        for i in range(args.spawns):
            order = hubs if i % 2 == 0 else hubs[::-1]
            for hub in order:
                settled += settle_pool()
                times[hub.name].append(hub.spawn_to_ready("bench"))
                hub.stop_server("bench")
            print(f"  round {i + 1}/{args.spawns}: " + ", ".join(f"{n.split()[0]} {t[-1]:.2f} s" for n, t in times.items()), flush=True)
        if args.rush_users > 0:
            rush_times, outcomes = run_rush(hubs, args)
    finally:
        for hub in hubs:
            hub.close()
        if args.keep:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    medians = {n: statistics.median(t) for n, t in times.items()}
    print()
    print(f"{'spawner':34} {'median':>8} {'min':>7} {'max':>7}  (spawn POST -> ready, {args.spawns} spawns each)")
    for n, t in times.items():
        print(f"{n:34} {medians[n]:7.2f}s {min(t):6.2f}s {max(t):6.2f}s")
    trainhub, stock = (medians[h.name] for h in hubs)
    ratio = trainhub / stock
    paired = statistics.median(a / b for a, b in zip(*(times[h.name] for h in hubs)))
    print(f"(for information: median of the per-round ratios = {paired:.3f}; load from elsewhere on the machine "
          "moves single spawns by seconds)")
    print(f"before the spawns, {settled:.1f} s in all waiting for trainhub's pool to stop importing (its refills run "
          "between spawns, not beside either hub's)")
    verdict = "PASS" if ratio <= args.target else "FAIL"
    print("stock: SimpleLocalProcessSpawner, same virtualenv, JUPYTER_CONFIG_DIR turning off trainhub's server and "
          "lab extensions; server extensions loaded: " + ", ".join(stock_extensions))
    print(f"ratio trainhub/stock = {ratio:.3f} (target <= {args.target:.2f}): {verdict}")
    rush_ok = True
    if args.rush_users > 0:
        rush_ok = report_rush(hubs, rush_times, outcomes, args.target)
    return 0 if verdict == "PASS" and rush_ok else 1


if __name__ == "__main__":
    sys.exit(main())
