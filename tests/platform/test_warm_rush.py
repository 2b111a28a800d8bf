"""A rush through a real `trainhub up`: several users spawn at once, the warm server pool grows at their arrivals,
refills past its floor once they are served, serves the next user warm, and shrinks back to its floor once nobody
has come for its window (trainhub.spawner.demand; docs/isolation.md#warm-servers)."""

from __future__ import annotations

import threading
from pathlib import Path

from trainhub.boundary.procs import processes_with
from waiting import wait_for

CONFIG = """
c.Spawner.poll_interval = 2
c.LocalGPUSpawner.warm_pool_size = 1
c.LocalGPUSpawner.warm_pool_per_arrival = 1
c.LocalGPUSpawner.warm_pool_window = 90
c.LocalGPUSpawner.warm_pool_lead = 0
c.LocalGPUSpawner.warm_pool_interval = 1
c.LocalGPUSpawner.warm_pool_memory_budget = "4GiB"
"""


def waiting_interpreters(instance: str) -> list[int]:
    """This hub's warm interpreters that no spawn has claimed: `python -m trainhub.spawner.warmstart` processes whose
    environment is still the launch one (a claim replaces it with the server's, JUPYTERHUB_USER included)."""
    found = []
    for pid in processes_with("TRAINHUB_INSTANCE", instance):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"trainhub.spawner.warmstart"] and not any(e.startswith(b"JUPYTERHUB_USER=") for e in environ):
            found.append(pid)
    return found


def test_several_users_at_once_the_pool_grows_refills_serves_the_next_warm_and_shrinks_when_idle(platform_factory):
    p = platform_factory("warm-rush", gpus=1, config=CONFIG)
    users = ["rusha", "rushb", "rushc"]
    wait_for(lambda: waiting_interpreters(p.instance), lambda w: len(w) == 1, what="the floor's interpreter at hub start",
             timeout=60)
    errors: list[BaseException] = []

    def spawn(user: str) -> None:
        try:
            p.spawn(user, "cpu", timeout=180)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=spawn, args=(u,)) for u in users]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not errors, errors
        log = p.log()
        for user in users:  # each started, warm or cold, and the log says which and why
            assert f"Spawning {user} from warm interpreter" in log or f"{user} starts cold: no warm interpreter" in log, user
        assert "Warm server pool: 1 -> 2 interpreters (1 spawn(s) in the last 90 s)" in log
        # refilled past the floor: 1 + 1 per spawn of the window, all three servers still running
        wait_for(lambda: waiting_interpreters(p.instance), lambda w: len(w) == 4, what="the pool refilled to 4",
                 timeout=120)
        p.spawn("rushd", "cpu", timeout=120)
        assert "Spawning rushd from warm interpreter" in p.log()
        # idle for the window: back to the floor, the surplus ended (the servers it started run on)
        wait_for(lambda: waiting_interpreters(p.instance), lambda w: len(w) == 1, what="the pool back to its floor",
                 timeout=240)
        assert "-> 1 interpreters (the floor (warm_pool_size))" in p.log()
        for user in users + ["rushd"]:
            assert p.server_model(user)["ready"], user
    finally:
        p.stop_all_servers()
