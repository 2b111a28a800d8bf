"""Table tests for the pure scheduling policies (FifoGangScheduler, TrainhubScheduler)."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from trainhub.scheduler import (
    WAIT_CODES,
    Allocation,
    FifoGangScheduler,
    JobRequest,
    Plan,
    Quotas,
    Scheduler,
    Start,
    TrainhubScheduler,
    WaitReason,
)


def job(id, user="alice", gpus=1, workers=1, at=0.0, limit=None, prio=0, groups=(), preemptible=False):
    return JobRequest(id, user, tuple(groups), workers, gpus, prio, at, limit, preemptible)


def alloc(id, placement, user="bob", kind="job", end=None, prio=0, preemptible=False, groups=(), started=0.0):
    return Allocation(id, user, tuple(groups), tuple(placement), kind, prio, started,
                      None if end is None else end - started, preemptible)


SCHEDULERS = {"fifo": FifoGangScheduler, "trainhub": TrainhubScheduler}


def run(kind, pending, running=(), capacity=None, quotas=Quotas(), now=10.0, **config):
    """One pass. Trainhub reserves at once here (reserve_after=0) unless a test says otherwise."""
    if kind == "trainhub":
        config.setdefault("reserve_after", 0)
    sched = SCHEDULERS[kind](**config)
    return sched.schedule(now, list(pending), list(running), {"a": 8} if capacity is None else capacity, quotas)


# -- placement and gangs ---------------------------------------------------------------------

PLACEMENT_CASES = [
    # (capacity, running, job, expected placement or None)
    ({"a": 4, "b": 4}, [], job("j", gpus=4, workers=2), (("a", 4), ("b", 4))),
    ({"a": 8, "b": 3}, [], job("j", gpus=2), (("b", 2),)),  # best fit: the fuller node
    ({"a": 8, "b": 8}, [alloc("r", [("b", 5)])], job("j", gpus=3), (("b", 3),)),
    ({"a": 8}, [], job("j", gpus=2, workers=3), (("a", 2), ("a", 2), ("a", 2))),
    ({"a": 4, "b": 4}, [alloc("r", [("a", 2)]), alloc("s", [("b", 2)])], job("j", gpus=4),
     None),  # 4 free in total, but a worker never spans nodes
    ({"a": 4, "b": 4}, [alloc("r", [("b", 1)])], job("j", gpus=4, workers=2), None),  # gang: all or none
    ({"a": 8}, [alloc("r", [("a", 8)])], job("cpu", gpus=0, workers=2), (("", 0), ("", 0))),  # CPU-only
]


@pytest.mark.parametrize("kind", SCHEDULERS)
@pytest.mark.parametrize("capacity, running, pending, expected", PLACEMENT_CASES)
def test_gang_placement(kind, capacity, running, pending, expected):
    plan = run(kind, [pending], running, capacity)
    if expected is None:
        assert plan.starts == ()
        assert plan.waiting[pending.id].code == "no-gpus"
    else:
        assert plan.starts == (Start(pending.id, expected),)
        assert plan.waiting == {}


# -- quotas ----------------------------------------------------------------------------------

QUOTA_CASES = [
    # (quotas, running, job, code or None, message)
    (Quotas(user_default=2), [alloc("r", [("a", 2)], user="alice")], job("j"),
     "quota-user", "over quota: alice holds 2 of 2 GPUs and this job needs 1"),
    (Quotas(user_default=2), [alloc("s", [("a", 1)], user="alice", kind="server")], job("j", gpus=2),
     "quota-user", "over quota: alice holds 1 of 2 GPUs and this job needs 2"),  # servers count
    (Quotas(user_default=2, users={"alice": 4}), [alloc("r", [("a", 2)], user="alice")], job("j", gpus=2),
     None, None),  # per-user override
    (Quotas(users={"alice": 0}), [], job("j"), "quota-user", "over quota: alice holds 0 of 0 GPUs and this job needs 1"),
    (Quotas(groups={"vision": 3}), [alloc("r", [("a", 2)], user="bob", groups=["vision"])],
     job("j", gpus=2, groups=["vision"]),
     "quota-group", "over group quota: vision holds 2 of 3 GPUs and this job needs 2"),
    (Quotas(groups={"vision": 3}), [alloc("r", [("a", 2)], user="bob", groups=["vision"])],
     job("j", gpus=1, groups=["vision", "nlp"]), None, None),
    (Quotas(user_default=0), [], job("cpu", gpus=0), None, None),  # CPU-only jobs hold no GPUs
]


@pytest.mark.parametrize("kind", SCHEDULERS)
@pytest.mark.parametrize("quotas, running, pending, code, message", QUOTA_CASES)
def test_quotas(kind, quotas, running, pending, code, message):
    plan = run(kind, [pending], running, {"a": 8}, quotas)
    if code is None:
        assert [s.job_id for s in plan.starts] == [pending.id]
    else:
        assert plan.starts == ()
        assert plan.waiting[pending.id] == WaitReason(pending.id, code, message)


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_quota_blocked_job_does_not_block_the_queue(kind):
    pending = [job("over", user="alice", gpus=2, at=0), job("next", user="bob", gpus=2, at=1)]
    plan = run(kind, pending, [], {"a": 8}, Quotas(users={"alice": 1}))
    assert [s.job_id for s in plan.starts] == ["next"]
    assert plan.waiting["over"].code == "quota-user"


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_quota_counts_jobs_started_in_the_same_pass(kind):
    pending = [job(f"j{i}", gpus=1, at=i) for i in range(5)]
    plan = run(kind, pending, [], {"a": 8}, Quotas(user_default=3))
    assert [s.job_id for s in plan.starts] == ["j0", "j1", "j2"]
    assert {plan.waiting[f"j{i}"].code for i in (3, 4)} == {"quota-user"}


# -- too large -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", SCHEDULERS)
@pytest.mark.parametrize("pending, message", [
    (job("j", gpus=16), "needs 16 GPUs per worker but the largest node has 8"),
    (job("j", gpus=8, workers=3), "needs 24 GPUs but the cluster has 16"),
    (job("j", gpus=5, workers=3), "needs 3 workers of 5 GPUs but the nodes can hold only 2 such workers"),
])
def test_too_large(kind, pending, message):
    plan = run(kind, [pending], [], {"a": 8, "b": 8})
    assert plan.waiting[pending.id] == WaitReason(pending.id, "too-large", message)


# -- head of line, backfill, reservation -----------------------------------------------------

# One 8-GPU node; r holds 6 GPUs until t=100. "big" (8 GPUs) is first in line; now = 10.
RUNNING = [alloc("r", [("a", 6)], end=100)]


@pytest.mark.parametrize("kind, small, code", [
    ("fifo", job("small", gpus=2, at=5, limit=50), "behind"),  # head-of-line blocking
    ("trainhub", job("small", gpus=2, at=5, limit=50), None),  # ends at 60 <= 100: backfills
    ("trainhub", job("small", gpus=2, at=5, limit=90), None),  # ends exactly at the reservation
    ("trainhub", job("small", gpus=2, at=5, limit=91), "reserved"),  # would delay big
    ("trainhub", job("small", gpus=2, at=5), "reserved"),  # no time limit: cannot backfill
    ("trainhub", job("small", gpus=3, at=5, limit=10), "behind"),  # does not fit now anyway
])
def test_backfill_against_reservation(kind, small, code):
    big = job("big", gpus=8, at=1, limit=1000)
    plan = run(kind, [big, small], RUNNING, {"a": 8})
    assert plan.head == "big"
    assert plan.waiting["big"].code == "no-gpus"
    if code is None:
        assert plan.starts == (Start("small", (("a", 2),), backfill=True),)
    else:
        assert plan.waiting["small"].code == code
        assert plan.waiting["small"].blocking_job == "big"


def test_reservation_reported_and_messages():
    big = job("big", gpus=8, at=1, limit=1000)
    plan = run("trainhub", [big, job("s1", gpus=2, at=5, limit=500), job("s2", gpus=2, at=6),
                            job("s3", gpus=4, at=7, limit=5)], RUNNING, {"a": 8})
    assert plan.waiting["big"] == WaitReason(
        "big", "no-gpus", "waiting for 8 GPUs: 2 of 8 free; expected to start in 1m30s at the latest", None, 100, 100)
    assert plan.waiting["s1"] == WaitReason(
        "s1", "reserved",
        "2 GPUs are free but held for job big, reserved to start in 1m30s; this job's time limit of 8m20s "
        "would delay it", "big", 100)
    assert plan.waiting["s2"].message == (
        "2 GPUs are free but held for job big; a job without a time limit may only use GPUs that job will not need")
    assert plan.waiting["s3"] == WaitReason(
        "s3", "behind", "waiting for 4 GPUs: 2 of 8 free; behind job big (priority 0)", "big")


def test_long_job_backfills_onto_gpus_the_head_does_not_need():
    # big needs one whole node at t=100 (node a); node b is held by a server forever, so its 4 free
    # GPUs are spare: a long job may use them, but not a's 2 free GPUs.
    capacity = {"a": 8, "b": 8}
    running = [alloc("r", [("a", 6)], end=100), alloc("srv", [("b", 4)], kind="server")]
    pending = [job("big", gpus=8, at=1), job("long", gpus=2, at=2, limit=10_000), job("nolimit", gpus=2, at=3),
               job("third", gpus=2, at=4, limit=10_000)]
    plan = run("trainhub", pending, running, capacity)
    assert plan.starts == (Start("long", (("b", 2),), True), Start("nolimit", (("b", 2),), True))
    assert plan.waiting["third"].code == "reserved"
    assert plan.waiting["big"].reserved_start == 100


# -- preemptible backfill (EASY backfill with reclaimable jobs) ------------------------------------

def test_preemptible_job_backfills_onto_reserved_gpus():
    # big holds a reservation at t=100 on node a; a preemptible job without a limit may use a's 2 free
    # GPUs (big preempts it when it needs them), a non-preemptible one may not
    pending = [job("big", gpus=8, at=1), job("plain", gpus=2, at=2), job("pre", gpus=2, at=3, preemptible=True)]
    plan = run("trainhub", pending, RUNNING, {"a": 8}, preemptible_backfill=True)
    assert plan.starts == (Start("pre", (("a", 2),), backfill=True),)
    assert plan.waiting["plain"].code == "reserved"
    assert plan.waiting["big"].reserved_start == 100  # unchanged: pre's GPUs count as free
    off = run("trainhub", pending, RUNNING, {"a": 8})  # off by default
    assert off.starts == () and off.waiting["pre"].code == "reserved"
    assert run("trainhub", pending, RUNNING, {"a": 8}, preemption=False, preemptible_backfill=True).starts == ()


def test_the_head_preempts_a_preemptible_job_that_overtook_it():
    # r ended; pre (same priority) started at t=5, after big was queued at t=1: big takes its GPUs back
    pre = Allocation("pre", "bob", (), (("a", 2),), started_at=5, preemptible=True, submitted_at=3)
    plan = run("trainhub", [job("big", gpus=8, at=1)], [pre], {"a": 8}, preemptible_backfill=True)
    assert plan.preempt == ("pre",)
    assert plan.waiting["big"].message.endswith("preempting pre to make room")
    # one that started before big was queued did not overtake it: big waits (equal priority)
    early = Allocation("pre", "bob", (), (("a", 2),), started_at=0.5, preemptible=True, submitted_at=0)
    plan = run("trainhub", [job("big", gpus=8, at=1)], [early], {"a": 8}, preemptible_backfill=True)
    assert plan.preempt == () and plan.waiting["big"].reserved_start is None
    # nor one of higher priority
    vip = Allocation("pre", "bob", (), (("a", 2),), priority=3, started_at=5, preemptible=True, submitted_at=3)
    assert run("trainhub", [job("big", gpus=8, at=1)], [vip], {"a": 8}, preemptible_backfill=True).preempt == ()
    assert run("trainhub", [job("big", gpus=8, at=1)], [pre], {"a": 8}).preempt == ()  # off by default


def test_no_preemptible_backfill_onto_gpus_freed_for_the_head_now():
    # big fits once pre is preempted: a later preemptible job must not take the GPUs big starts on
    pre = Allocation("pre", "bob", (), (("a", 4),), started_at=5, preemptible=True, submitted_at=3)
    plan = run("trainhub", [job("big", gpus=8, at=1), job("late", gpus=2, at=6, preemptible=True)], [pre], {"a": 8},
               preemptible_backfill=True)
    assert plan.preempt == ("pre",) and plan.starts == ()


def test_fifo_has_no_backfill_and_trainhub_can_turn_it_off():
    pending = [job("big", gpus=8, at=1), job("small", gpus=1, at=2, limit=1)]
    for kind, config in [("fifo", {}), ("trainhub", {"backfill": False}), ("trainhub", {"backfill_depth": 0})]:
        plan = run(kind, pending, RUNNING, {"a": 8}, **config)
        assert plan.starts == ()
        assert plan.waiting["small"].code == "behind"


def test_no_promise_when_the_gpus_are_held_without_limit():
    plan = run("fifo", [job("big", gpus=8)], [alloc("srv", [("a", 1)], kind="server")], {"a": 8})
    assert plan.waiting["big"].reserved_start is None
    assert "no start time can be promised" in plan.waiting["big"].message


def test_reserve_after_delays_the_reservation():
    pending = [job("big", gpus=8, at=1), job("long", gpus=2, at=2, limit=10_000)]
    early = run("trainhub", pending, RUNNING, {"a": 8}, now=10, reserve_after=600)
    assert [s.job_id for s in early.starts] == ["long"]
    assert early.waiting["big"].reserved_start is None
    assert "once it has waited 10m00s" in early.waiting["big"].message
    # not a promise, but an estimate from the running work's time limits all the same
    assert early.waiting["big"].estimated_start == 100  # RUNNING ends at 100
    assert "expected to start in about" in early.waiting["big"].message
    late = run("trainhub", pending, RUNNING, {"a": 8}, now=700, reserve_after=600)
    assert late.starts == ()
    assert late.waiting["long"].code == "reserved"


# -- priorities, aging, fair share -----------------------------------------------------------

def test_priority_order_and_group_defaults():
    pending = [job("low", gpus=8, at=0), job("high", gpus=8, at=5, prio=3),
               job("prod", gpus=8, at=9, groups=["prod"])]
    plan = run("trainhub", pending, [], {"a": 8}, group_priorities={"prod": 5})
    assert [s.job_id for s in plan.starts] == ["prod"]
    assert plan.head == "high"
    assert plan.waiting["low"].message == "waiting for 8 GPUs: 0 of 8 free; behind job high (priority 3)"
    fifo = run("fifo", pending, [], {"a": 8})
    assert [s.job_id for s in fifo.starts] == ["low"]


@pytest.mark.parametrize("now, aging_interval, aging_max, first", [
    (11000.0, 3600, None, "old"),  # old waited 3h: level 0+3 > new's 1+1
    (11000.0, 0, None, "new"),  # aging off: priority 1 beats priority 0
    (11000.0, 3600, 1, "new"),  # aging capped at one level: 0+1 < 1+1
    (7100.0, 3600, None, "old"),  # 0+1 == 1+0: equal level, so submit time decides
])
def test_aging(now, aging_interval, aging_max, first):
    pending = [job("old", gpus=8, at=0), job("new", gpus=8, at=7000, prio=1)]
    plan = run("trainhub", pending, [], {"a": 8}, now=now, aging_interval=aging_interval, aging_max=aging_max)
    assert [s.job_id for s in plan.starts] == [first]


def test_fair_share_orders_equal_priority_by_usage():
    running = [alloc("r", [("a", 4)], user="alice")]
    pending = [job("a1", user="alice", gpus=4, at=0), job("b1", user="bob", gpus=4, at=5)]
    plan = run("trainhub", pending, running, {"a": 8})
    assert [s.job_id for s in plan.starts] == ["b1"]
    plain = run("trainhub", pending, running, {"a": 8}, fair_share=False)
    assert [s.job_id for s in plain.starts] == ["a1"]
    # Nothing free: bob's job heads the queue and alice's earlier one is told why.
    full = run("trainhub", pending, [alloc("r", [("a", 8)], user="alice")], {"a": 8})
    assert full.head == "b1"
    assert full.waiting["a1"] == WaitReason(
        "a1", "fair-share",
        "waiting for 4 GPUs: 0 of 8 free; behind job b1 of bob, who holds fewer GPUs (fair share)", "b1")


def test_fair_share_is_recomputed_within_a_pass():
    pending = [job(f"a{i}", user="alice", at=i) for i in range(4)] + [job(f"b{i}", user="bob", at=10 + i) for i in range(4)]
    plan = run("trainhub", pending, [], {"a": 4})
    assert sorted(s.job_id for s in plan.starts) == ["a0", "a1", "b0", "b1"]


# -- preemption ------------------------------------------------------------------------------

PREEMPT_CASES = [
    # (running, head job, expected victims)
    ([alloc("p1", [("a", 8)], preemptible=True), alloc("p2", [("b", 4)], preemptible=True),
      alloc("p3", [("b", 4)], preemptible=True)],
     job("vip", gpus=8, prio=5), ("p1",)),  # one victim suffices; b's 4 GPUs alone do not
    ([alloc("p1", [("a", 4)], preemptible=True), alloc("p2", [("a", 4)], preemptible=True),
      alloc("x", [("b", 8)])],
     job("vip", gpus=8, prio=5), ("p1", "p2")),  # no single victim: the pair on one node
    ([alloc("p1", [("a", 2)], preemptible=True, started=5), alloc("p2", [("a", 2)], preemptible=True, started=1),
      alloc("x", [("a", 4)]), alloc("y", [("b", 6)]), alloc("p3", [("b", 2)], preemptible=True)],
     job("vip", gpus=2, prio=5), ("p1",)),  # smallest, most recently started
    ([alloc("p1", [("a", 8)], preemptible=False), alloc("p2", [("b", 8)], kind="server", preemptible=True)],
     job("vip", gpus=8, prio=5), ()),  # never non-preemptible jobs or servers
    ([alloc("p1", [("a", 8)], preemptible=True, prio=5), alloc("p2", [("b", 8)], preemptible=True, prio=7)],
     job("vip", gpus=8, prio=5), ()),  # only lower priority
    ([alloc("p1", [("a", 8)], preemptible=True, prio=1), alloc("p2", [("b", 4)], preemptible=True),
      alloc("x", [("b", 4)])],
     job("vip", gpus=16, workers=2, prio=5), ()),  # even all candidates would not make room
]


@pytest.mark.parametrize("running, head, victims", PREEMPT_CASES)
def test_preemption_choice(running, head, victims):
    plan = run("trainhub", [head], running, {"a": 8, "b": 8})
    assert plan.preempt == victims
    assert plan.starts == ()
    if victims:
        assert plan.waiting[head.id].message.endswith("preempting " + ", ".join(victims) + " to make room")


def test_preemption_respects_group_default_and_switch():
    running = [alloc("p1", [("a", 8)], preemptible=True)]
    head = job("vip", gpus=8, groups=["prod"])
    assert run("trainhub", [head], running, group_priorities={"prod": 2}).preempt == ("p1",)
    assert run("trainhub", [head], running, group_priorities={"prod": 2}, preemption=False).preempt == ()
    assert run("fifo", [job("vip", gpus=8, prio=9)], running).preempt == ()


def test_no_preemption_of_a_victim_that_would_overtake_the_head():
    # p1 was queued 5h ago: requeued it would have aged to level 5, equal to vip's -> no ping-pong.
    running = [Allocation("p1", "bob", (), (("a", 8),), started_at=18000, preemptible=True, submitted_at=0)]
    plan = run("trainhub", [job("vip", gpus=8, prio=5, at=18000)], running, now=18000)
    assert plan.preempt == ()


# -- CPU-only jobs ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", SCHEDULERS)
def test_cpu_jobs_ignore_gpus_but_respect_max_cpu_jobs(kind):
    running = [alloc("r", [("a", 8)]), alloc("c0", [("", 0)])]
    pending = [job("big", gpus=8, at=0), job("c1", gpus=0, at=1), job("c2", gpus=0, at=2)]
    plan = run(kind, pending, running, {"a": 8}, max_cpu_jobs=2)
    assert [s.job_id for s in plan.starts] == ["c1"]
    assert plan.waiting["c2"] == WaitReason("c2", "cpu-limit", "waiting for a CPU-only job slot: 2 of 2 running")
    assert run(kind, pending, running, {"a": 8}).waiting.keys() == {"big"}


# -- contract --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", SCHEDULERS)
def test_pure_and_deterministic(kind):
    pending = [job(f"j{i}", user=f"u{i % 3}", gpus=[1, 2, 4, 8][i % 4], at=i, limit=100 * (i % 5) or None,
                   preemptible=i % 2 == 0, prio=i % 3) for i in range(30)]
    running = [alloc("r1", [("a", 3)], end=500, preemptible=True), alloc("s", [("b", 1)], kind="server")]
    capacity = {"a": 8, "b": 8, "c": 4}
    before = (list(pending), list(running), dict(capacity))
    plans = [run(kind, pending, running, capacity, Quotas(user_default=6)) for _ in range(2)]
    assert plans[0] == plans[1]
    assert (pending, running, capacity) == before
    assert set(plans[0].waiting) | {s.job_id for s in plans[0].starts} == {j.id for j in pending}
    assert all(r.code in WAIT_CODES and r.message for r in plans[0].waiting.values())


def test_empty_inputs():
    for kind in SCHEDULERS:
        assert run(kind, [], [], {}) == Plan()
        assert run(kind, [job("j", gpus=1)], [], {}).waiting["j"].code == "too-large"


def test_base_class_contract_and_config():
    with pytest.raises(NotImplementedError):
        Scheduler().schedule(0, [], [], {}, Quotas())
    c = Config()
    c.TrainhubScheduler.group_priorities = {"prod": 4}
    c.TrainhubScheduler.backfill_depth = 7
    c.Scheduler.max_cpu_jobs = 3
    sched = TrainhubScheduler(config=c)
    assert (sched.group_priorities, sched.backfill_depth, sched.max_cpu_jobs) == ({"prod": 4}, 7, 3)
    for cls in (FifoGangScheduler, TrainhubScheduler):
        for name, trait in cls.class_traits(config=True).items():
            assert trait.help.strip(), f"{cls.__name__}.{name} has no help"


@pytest.mark.parametrize("kind", SCHEDULERS)
def test_reasons_of_the_rest_of_the_queue(kind):
    # Nothing is free, so everything after the head is only explained when read.
    running = [alloc("r", [("a", 8)], user="bob", end=50)]
    pending = [job("head", gpus=8, at=0), job("over", user="carol", gpus=2, at=1), job("huge", gpus=16, at=2),
               job("small", gpus=1, at=3)]
    plan = run(kind, pending, running, {"a": 8}, Quotas(users={"carol": 1}))
    assert len(plan.waiting) == 4 and "small" in plan.waiting and "nobody" not in plan.waiting
    with pytest.raises(KeyError):
        plan.waiting["nobody"]
    reasons = dict(plan.waiting)
    assert {k: r.code for k, r in reasons.items()} == {
        "head": "no-gpus", "over": "quota-user", "huge": "too-large", "small": "behind"}
    assert reasons["small"].message == "waiting for 1 GPU: 0 of 8 free; behind job head (priority 0)"
    assert plan == run(kind, pending, running, {"a": 8}, Quotas(users={"carol": 1}))


@pytest.mark.parametrize("placement", ["end-aligned", "best-fit"])
def test_backfill_does_not_take_the_gpus_the_victims_free_when_a_job_is_overdue(placement):
    """The head fits on its victims' GPUs, not on those of a job past its time limit that still runs:
    the reservation used to release the overdue job first (both are "now"), so backfill could take the
    GPUs beside the victim and the head did not fit once the victim was gone (docs/scheduler.md)."""
    capacity = {"A": 8, "B": 8}
    running = [
        Allocation("v", "u", (), (("A", 4),), started_at=0.0, time_limit=10_000.0, preemptible=True),
        Allocation("a-overdue", "w", (), (("B", 8),), started_at=0.0, time_limit=100.0),
    ]
    head = JobRequest("head", "h", workers=1, gpus_per_worker=8, priority=5, submitted_at=500.0, time_limit=600.0)
    other = JobRequest("j", "x", workers=1, gpus_per_worker=4, submitted_at=600.0, time_limit=5_000.0)
    plan = TrainhubScheduler(placement=placement).schedule(1000.0, [head, other], running, capacity, Quotas())
    assert plan.preempt == ("v",) and plan.head == "head"
    assert plan.starts == ()
    assert plan.waiting["j"].code == "reserved" and plan.waiting["j"].blocking_job == "head"
