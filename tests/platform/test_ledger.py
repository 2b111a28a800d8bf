"""The GPU ledger (LocalGPUAllocator) on a real SQLite file: allocation, quotas, release, reconcile."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from trainhub.exceptions import InvalidRequest, NoFreeGPUs, QuotaExceeded
from trainhub.gpus import simulated_devices
from trainhub.ledger import LocalGPUAllocator, pid_alive, process_start_time, server_holder
from trainhub.quotas import QuotaPolicy


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'ledger.sqlite'}"


def make(db_url, n=4, names=None):
    devices = [d.to_dict() for d in simulated_devices(n)]
    if names:
        for d, name in zip(devices, names):
            d["name"] = name
    return LocalGPUAllocator(db_url=db_url, device_list=devices)


def test_allocate_release_and_holdings(db_url):
    a = make(db_url)
    assert a.allocate("server:alice/", kind="server", user="alice", count=2, profile="gpu-2") == [0, 1]
    assert a.allocate("server:bob/", kind="server", user="bob", count=1) == [2]
    held = {h.device: h.user for h in a.holdings()}
    assert held == {0: "alice", 1: "alice", 2: "bob"}
    assert [d.index for d in a.free_devices()] == [3]
    assert a.release("server:alice/") == [0, 1]
    assert a.release("server:alice/") == []  # idempotent
    assert [d.index for d in a.free_devices()] == [0, 1, 3]


def test_zero_gpus_holds_nothing_and_negative_is_refused(db_url):
    a = make(db_url)
    assert a.allocate("server:c/", kind="server", user="c", count=0) == []
    assert a.holdings() == []
    with pytest.raises(InvalidRequest):
        a.allocate("server:c/", kind="server", user="c", count=-1)


def test_reallocation_for_the_same_holder_replaces(db_url):
    a = make(db_url)
    a.allocate("server:a/", kind="server", user="a", count=2)
    assert a.allocate("server:a/", kind="server", user="a", count=1) == [0]
    assert len(a.holdings()) == 1


def test_no_free_gpus_says_how_many(db_url):
    a = make(db_url)
    a.allocate("server:a/", kind="server", user="a", count=3)
    with pytest.raises(NoFreeGPUs, match="asked for 2, 1 of 4 free") as e:
        a.allocate("server:b/", kind="server", user="b", count=2)
    assert e.value.status_code == 409 and e.value.details == {"requested": 2, "free": 1, "total": 4}
    with pytest.raises(NoFreeGPUs, match="has only 4"):
        a.allocate("server:b/", kind="server", user="b", count=5)
    assert {h.holder for h in a.holdings()} == {"server:a/"}  # nothing held on error


def test_quota_checked_with_the_allocation(db_url):
    a = make(db_url)
    q = QuotaPolicy(user_gpu_limit=2)
    a.allocate("server:a/", kind="server", user="a", count=1, quota=q)
    a.allocate("job:1", kind="job", user="a", count=1, quota=q)  # jobs count too
    with pytest.raises(QuotaExceeded, match="holds 2 of 2") as e:
        a.allocate("server:a/x", kind="server", user="a", count=1, quota=q)
    assert e.value.status_code == 403
    assert a.allocate("server:b/", kind="server", user="b", count=2, quota=q) == [2, 3]


def test_group_quota(db_url):
    a = make(db_url)
    q = QuotaPolicy(group_gpu_limits={"students": 2})
    members = {"students": ["s1", "s2"]}
    a.allocate("server:s1/", kind="server", user="s1", count=1, quota=q, user_groups=["students"], group_members=members)
    a.allocate("server:s2/", kind="server", user="s2", count=1, quota=q, user_groups=["students"], group_members=members)
    with pytest.raises(QuotaExceeded, match="group 'students' holds 2 of 2"):
        a.allocate("server:s1/b", kind="server", user="s1", count=1, quota=q, user_groups=["students"], group_members=members)


def test_gpu_model_filter(db_url):
    a = make(db_url, names=["NVIDIA A100", "NVIDIA A100", "NVIDIA T4", "NVIDIA T4"])
    assert a.allocate("server:a/", kind="server", user="a", count=1, gpu_model="t4") == [2]
    with pytest.raises(NoFreeGPUs, match="A100 GPUs"):
        a.allocate("server:b/", kind="server", user="b", count=3, gpu_model="A100")


def test_concurrent_allocations_never_share_a_device(db_url):
    make(db_url)  # create tables
    results, errors = [], []

    def worker(i):
        a = make(db_url)
        try:
            results.append(a.allocate(f"server:u{i}/", kind="server", user=f"u{i}", count=1))
        except NoFreeGPUs:
            errors.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    devices = [d for r in results for d in r]
    assert len(devices) == len(set(devices)) == 4 and len(errors) == 4


def _alloc_in_process(db_url, i, q):
    a = make(db_url)
    try:
        q.put(a.allocate(f"server:p{i}/", kind="server", user=f"p{i}", count=1))
    except NoFreeGPUs:
        q.put(None)


def test_concurrent_processes_never_share_a_device(db_url):
    make(db_url)
    ctx = multiprocessing.get_context("fork")  # "spawn" breaks once IPython tests replace __main__
    q = ctx.Queue()
    procs = [ctx.Process(target=_alloc_in_process, args=(db_url, i, q)) for i in range(6)]
    for p in procs:
        p.start()
    got = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    devices = [d for r in got if r for d in r]
    assert len(devices) == len(set(devices)) == 4 and got.count(None) == 2


def test_set_pid_and_reconcile(db_url):
    a = make(db_url)
    a.allocate(server_holder("alive"), kind="server", user="alive", count=1)
    a.allocate(server_holder("dead"), kind="server", user="dead", count=1)
    a.allocate("job:7", kind="job", user="j", count=1)
    a.set_pid(server_holder("alive"), os.getpid())
    a.set_pid(server_holder("dead"), 2**22 + 12345)  # no such pid
    released = a.reconcile(lambda h: h.kind != "server" or pid_alive(h.pid, h.pid_started))
    assert {h.holder for h in released} == {"server:dead/"}
    assert {h.holder for h in a.holdings()} == {"server:alive/", "job:7"}


def test_pid_alive_detects_reuse():
    me = os.getpid()
    started = process_start_time(me)
    assert pid_alive(me, started) and pid_alive(me, None)
    assert not pid_alive(me, started - 100)  # same pid, other process start time
    assert not pid_alive(None, None) and not pid_alive(0, None)
