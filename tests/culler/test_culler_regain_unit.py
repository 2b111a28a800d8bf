"""Unit tests of "get a GPU again" (GPUCuller.regain): the request waits in the server queue while the
server runs on the CPU, the grant moves it (snapshot, stop, start on the GPU profile), a cancel or a
stopped server gives a grant back.

NOT an acceptance test: the hub is the in-process stand-in of test_culler_service_unit (no HTTP, no
JupyterHub), and the jobs service's grant is done here the way its engine does it (allocate for the
server's holder, then ``ServerQueue.grant``). The ledger, the queue, the audit table are the real ones.
The end-to-end test, through a real `trainhub up` and a real kernel, is test_regain_keeps_variables.py.
"""

from __future__ import annotations

import asyncio

import pytest

from trainhub.exceptions import Conflict, InvalidRequest
from trainhub.ledger import server_holder
from trainhub.serverqueue import GRANTED, WAITING, ServerQueue
from trainhub.spawner.reconcile import reserved_holders

from test_culler_service_unit import InProcessHubClient, rig  # noqa: F401  (the fixture)


class MovingHub(InProcessHubClient):
    """The stand-in, with what a move needs: the user model, snapshots, and a spawner that leaves a granted
    reservation alone when the CPU server stops and takes it over when the server starts on GPUs."""

    def __init__(self, allocator):
        super().__init__(allocator)
        self.stopped_by_user = set()
        self.announced = []

    def add_cpu(self, user, name=""):
        return self.add(user, name, gpus=0, profile="cpu")

    async def user_model(self, user):
        servers = {}
        for (u, name), s in self.servers.items():
            if u == user and (u, name) not in self.stopped_by_user:
                servers[name] = {"name": name, "ready": True, "pending": None, "url": f"/user/{u}/" + (f"{name}/" if name else ""),
                                 "user_options": {"profile": s["profile"]}}
        return {"name": user, "groups": [], "servers": servers}

    async def server_model(self, user, name):
        return (await self.user_model(user))["servers"].get(name)

    async def announce_move(self, server_url, move, timeout=5.0):
        self.calls.append(("announce", server_url, move["action"], move["profile"]))
        self.announced.append(move)

    async def snapshot(self, server_url, timeout):
        self.calls.append(("snapshot", server_url))
        return {"kernels": [{"session_path": "work.ipynb", "notebook": "work.ipynb", "kept": ["n"], "not_kept": {}}],
                "saved": 1, "failed": 0}

    async def stop_server(self, user, name):
        self.calls.append(("stop", user, name, sorted(self.reserved())))
        holder = server_holder(user, name)
        if holder not in self.reserved():  # as LocalGPUSpawner._cleanup
            self.allocator.release(holder)
        self.servers.pop((user, name))
        return True

    def reserved(self):
        return reserved_holders(self.allocator)

    async def start_server(self, user, name, profile):
        gpus = {"cpu": 0, "gpu-1": 1, "gpu-2": 2}[profile]
        # the spawner's allocation for the same holder replaces the reservation (one transaction)
        devs = self.allocator.allocate(server_holder(user, name), kind="server", user=user, count=gpus, profile=profile)
        self.calls.append(("start", user, name, profile, devs))
        self.servers[(user, name)] = {"kernels": [], "jobs": 0, "profile": profile, "status": {}}

    async def wait_started(self, user, name, timeout):
        self.calls.append(("started", user, name))


@pytest.fixture
def mover(rig):  # noqa: F811
    rig.client = MovingHub(rig.allocator)
    rig.jobs_api_url = "http://jobs.invalid/api"  # the queue's grants come from the jobs service
    rig.regain_heartbeat = 0.01
    rig.move_notice_grace = 0  # (the pages' time to save before a move: none here)
    return rig


def grant(culler, holder, count):
    """What the jobs engine does when the request's turn comes."""
    devices = culler.allocator.allocate(holder, kind="server", user=holder.split(":")[1].split("/")[0], count=count,
                                        profile="gpu-1")
    assert ServerQueue(culler.allocator.db_url).grant(holder, devices)
    return devices


async def until(predicate, what, timeout=30.0):
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_waits_in_line_on_the_cpu_then_moves_with_a_snapshot(mover):
    hub, queue = mover.client, ServerQueue(mover.allocator.db_url)
    hub.add("hog", gpus=6, profile="gpu-2")  # every GPU held
    hub.add_cpu("alice")
    holder = server_holder("alice")
    answer = await mover.regain("alice", "", "gpu-1")
    assert answer["state"] == "waiting" and answer["profile"] == "gpu-1" and "running on the CPU" in answer["message"]
    assert "restored in each notebook's kernel" in answer["message"]
    row = queue.get(holder)
    assert row.state == WAITING and row.gpus == 1 and row.profile == "gpu-1"
    with pytest.raises(Conflict, match="already waiting"):
        await mover.regain("alice", "", "gpu-1")
    with pytest.raises(Conflict, match="waiting to be moved to GPUs"):
        await mover.give_back("alice", "")
    await asyncio.sleep(0.1)
    assert mover.regain_status("alice")["state"] == "waiting" and ("stop", "alice", "") not in hub.calls[-1:]
    queue.update_waiting({holder: ("every GPU is held (6 of 6)", 1, 1, None)})
    await until(lambda: mover.regain_status("alice")["position"] == 1, "the position")
    assert mover.regain_status("alice")["reason"] == "every GPU is held (6 of 6)"

    mover.allocator.release(server_holder("hog"))
    [device] = grant(mover, holder, 1)
    await until(lambda: mover.regain_status("alice")["finished_at"], "the move")
    assert mover.regain_status("alice")["state"] == "done"
    moves = [c for c in hub.calls if c[0] in ("announce", "snapshot", "stop", "start", "started")]
    assert moves == [("announce", "/user/alice/", "regain", "gpu-1"), ("snapshot", "/user/alice/"), ("stop", "alice", "", [holder]),
                     ("start", "alice", "", "gpu-1", [device]), ("started", "alice", "")], moves
    assert [h.device for h in mover.allocator.holdings() if h.holder == holder] == [device]
    assert queue.get(holder) is None and holder not in mover._regain_tasks
    [row] = mover.audit.list(user="alice", limit=10)
    assert row["action"] == "regain" and row["acted"] and row["measurements"]["snapshot"]["saved"] == 1
    assert row["reason"].startswith("the user asked for a GPU again: restarted on gpu-1")
    with pytest.raises(Conflict, match="already holds GPUs"):
        await mover.regain("alice", "", "gpu-1")


async def test_bad_requests_are_refused_with_the_reason(mover):
    hub = mover.client
    hub.add_cpu("bob")
    with pytest.raises(InvalidRequest, match="has no GPU"):
        await mover.regain("bob", "", "cpu")
    with pytest.raises(InvalidRequest):
        await mover.regain("bob", "", "no-such-profile")
    with pytest.raises(Conflict, match="not running"):
        await mover.regain("bob", "other", "gpu-1")
    with pytest.raises(Conflict, match="not waiting"):
        mover.cancel_regain("bob")
    mover.jobs_api_url = ""
    with pytest.raises(Conflict, match="no jobs service"):
        await mover.regain("bob", "", "gpu-1")
    assert ServerQueue(mover.allocator.db_url).all() == []


async def test_no_profile_named_asks_for_the_smallest_gpu_profile(mover):
    mover.client.add_cpu("dave")
    assert (await mover.regain("dave"))["profile"] == "gpu-1"
    mover.cancel_regain("dave")
    await until(lambda: "server:dave/" not in mover._regain_tasks, "the cancel")


async def test_cancel_withdraws_the_request_and_a_late_grant_goes_back(mover):
    hub, queue = mover.client, ServerQueue(mover.allocator.db_url)
    hub.add("hog", gpus=6, profile="gpu-2")
    hub.add_cpu("carol")
    holder = server_holder("carol")
    await mover.regain("carol", "", "gpu-1")
    assert mover.cancel_regain("carol")["message"].startswith("Request withdrawn")
    await until(lambda: mover.regain_status("carol")["finished_at"], "the cancel")
    assert mover.regain_status("carol")["state"] == "cancelled"
    assert queue.get(holder) is None and not [h for h in mover.allocator.holdings() if h.holder == holder]
    assert ("stop", "carol", "") not in [c[:3] for c in hub.calls]
    [row] = mover.audit.list(user="carol", limit=10)
    assert row["action"] == "regain" and not row["acted"] and row["error"] == "cancelled by the user"


async def test_a_server_stopped_while_waiting_gives_its_grant_back(mover):
    hub, queue = mover.client, ServerQueue(mover.allocator.db_url)
    hub.add("hog", gpus=6, profile="gpu-2")
    hub.add_cpu("erin")
    holder = server_holder("erin")
    await mover.regain("erin", "", "gpu-1")
    hub.stopped_by_user.add(("erin", ""))
    await until(lambda: mover.regain_status("erin")["finished_at"], "the failure")
    assert mover.regain_status("erin")["state"] == "failed"
    assert "stopped while it waited" in mover.regain_status("erin")["message"]
    assert queue.get(holder) is None and not [h for h in mover.allocator.holdings() if h.holder == holder]


async def test_a_granted_reservation_survives_the_hub_reconciler_while_looked_after(mover):
    """The hub frees server holdings with no live process, except a grant the culler still looks after."""
    queue = ServerQueue(mover.allocator.db_url)
    holder = server_holder("frank")
    queue.enqueue(holder, user="frank", groups=[], gpus=1, profile="gpu-1", gpu_model=None, reason="x")
    grant(mover, holder, 1)
    assert queue.get(holder).state == GRANTED and reserved_holders(mover.allocator) == {holder}
    from trainhub.spawner.reconcile import server_alive

    mover.allocator.reconcile(lambda h: server_alive(h) or h.holder in reserved_holders(mover.allocator))
    assert [h.holder for h in mover.allocator.holdings()] == [holder]
    queue.withdraw(holder)  # nobody looks after it any more: the reconciler frees it
    mover.allocator.reconcile(lambda h: server_alive(h) or h.holder in reserved_holders(mover.allocator))
    assert mover.allocator.holdings() == []


async def test_the_pages_of_a_server_are_told_before_it_moves(mover):
    """Give my GPU back (and the idle release, the same _act): the server's pages hear of the move first, so they show
    its progress instead of JupyterLab's "Server unavailable" dialog; the message says what is kept."""
    hub = mover.client
    hub.add("bob", gpus=1, profile="gpu-1")
    await mover.give_back("bob", "")
    await until(lambda: any(c[0] == "start" for c in hub.calls), "the release")
    moves = [c[:2] for c in hub.calls if c[0] in ("announce", "snapshot", "stop", "start")]
    assert moves == [("announce", "/user/bob/"), ("snapshot", "/user/bob/"), ("stop", "bob"), ("start", "bob")], moves
    [move] = hub.announced
    assert move["action"] == "release" and move["profile"] == "cpu" and move["variables"] is True
    assert "your variables are kept" in move["message"] and "reconnects by itself" in move["message"]


async def test_a_move_goes_on_when_its_pages_cannot_be_told(mover):
    hub = mover.client

    async def unreachable(server_url, move, timeout=5.0):
        raise ConnectionError("the server does not answer")

    hub.announce_move = unreachable
    hub.add("cid", gpus=1, profile="gpu-1")
    await mover.give_back("cid", "")
    await until(lambda: any(c[0] == "start" for c in hub.calls), "the release")
    assert [c[0] for c in hub.calls if c[0] in ("snapshot", "stop", "start")] == ["snapshot", "stop", "start"]
