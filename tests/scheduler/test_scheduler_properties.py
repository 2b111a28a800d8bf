"""Property tests: the scheduling invariants hold for arbitrary clusters, queues and quotas.

200 examples per property by default; ``SCHEDULER_EXAMPLES=2000`` searches harder.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from scheduler_reference import as_allocations, holdings, reservation

from trainhub.scheduler import (
    WAIT_CODES,
    Allocation,
    FifoGangScheduler,
    JobRequest,
    Quotas,
    TrainhubScheduler,
)

USERS = ("alice", "bob", "carol")
GROUPS = ("vision", "nlp")
NOW = 10_000.0


@st.composite
def scenarios(draw):
    capacity = {f"n{i}": draw(st.sampled_from([1, 2, 4, 8, 8])) for i in range(draw(st.integers(1, 4)))}
    free = dict(capacity)
    running = []
    for i in range(draw(st.integers(0, 10))):
        node = draw(st.sampled_from(sorted(capacity)))
        if free[node] == 0:
            continue
        gpus = draw(st.integers(1, free[node]))
        free[node] -= gpus
        kind = draw(st.sampled_from(["job", "job", "server"]))
        started = draw(st.floats(NOW - 20_000, NOW))
        # Mostly still within their limit (ending 1 min to 10 h from now), sometimes overdue.
        limit = draw(st.one_of(st.none(), st.floats(1, 30_000),
                               st.sampled_from([60.0, 600.0, 3600.0, 36_000.0]).map(lambda d: NOW - started + d)))
        running.append(Allocation(
            id=f"r{i}", user=draw(st.sampled_from(USERS)),
            groups=tuple(draw(st.lists(st.sampled_from(GROUPS), max_size=2, unique=True))),
            placement=((node, gpus),), kind=kind, priority=draw(st.integers(0, 3)), started_at=started,
            time_limit=None if kind == "server" else limit, preemptible=draw(st.booleans()),
            submitted_at=started - draw(st.floats(0, 20_000)),
        ))
    pending = [
        JobRequest(
            id=f"j{i}", user=draw(st.sampled_from(USERS)),
            groups=tuple(draw(st.lists(st.sampled_from(GROUPS), max_size=2, unique=True))),
            workers=draw(st.integers(1, 3)), gpus_per_worker=draw(st.sampled_from([0, 1, 1, 2, 4, 8])),
            priority=draw(st.integers(0, 5)), submitted_at=draw(st.floats(0, NOW)),
            time_limit=draw(st.one_of(st.none(), st.floats(1, 30_000), st.sampled_from([30.0, 300.0, 3000.0]))),
            preemptible=draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 12)))
    ]
    quotas = Quotas(
        user_default=draw(st.one_of(st.none(), st.integers(0, 16))),
        users={u: draw(st.integers(0, 16)) for u in draw(st.lists(st.sampled_from(USERS), unique=True))},
        groups={g: draw(st.integers(0, 16)) for g in draw(st.lists(st.sampled_from(GROUPS), unique=True))},
    )
    return capacity, running, pending, quotas


@st.composite
def contended(draw):
    """Nodes of 8 GPUs, mostly busy until known times, a large urgent job first in line and small
    jobs behind it: the situations where backfill and preemption decide."""
    capacity = {f"n{i}": 8 for i in range(draw(st.integers(1, 4)))}
    running = []
    for node in capacity:
        left = 8 - draw(st.integers(0, 4))  # GPUs to hand out on this node
        while left > 0:
            gpus = draw(st.sampled_from(sorted({left, max(1, left // 2), 1})))
            left -= gpus
            kind = draw(st.sampled_from(["job"] * 5 + ["server"]))
            ends_in = draw(st.sampled_from([-5.0, 60.0, 600.0, 3600.0, 36_000.0]))
            running.append(Allocation(
                id=f"r{len(running)}", user=draw(st.sampled_from(USERS)), groups=(), placement=((node, gpus),),
                kind=kind, priority=draw(st.integers(0, 2)), started_at=NOW - 100,
                time_limit=None if kind == "server" or draw(st.integers(0, 5)) == 0 else 100 + ends_in,
                preemptible=draw(st.sampled_from([True, True, True, False])),
                submitted_at=NOW - 100 - draw(st.sampled_from([0.0, 0.0, 20_000.0])),
            ))
    head_workers = draw(st.integers(1, len(capacity)))
    pending = [JobRequest("head", draw(st.sampled_from(USERS)), (), head_workers, 8, draw(st.integers(1, 5)),
                          NOW - 7200, draw(st.sampled_from([None, 3000.0])), False)]
    for i in range(draw(st.integers(1, 10))):
        pending.append(JobRequest(
            f"j{i}", draw(st.sampled_from(USERS)), (), 1, draw(st.sampled_from([1, 2, 4, 8])), 0, NOW - 60 + i,
            draw(st.sampled_from([None, 30.0, 300.0, 3000.0, 36_000.0])), draw(st.booleans()),
        ))
    return capacity, running, pending, Quotas()


POLICIES = st.one_of(
    st.just(FifoGangScheduler()),
    st.builds(
        TrainhubScheduler,
        aging_interval=st.sampled_from([0.0, 600.0, 3600.0]),
        reserve_after=st.sampled_from([0.0, 0.0, 3600.0]),
        backfill_depth=st.sampled_from([0, 3, 1000]),
        backfill_per_user=st.sampled_from([0, 1, 4]),
        group_priorities=st.sampled_from([{}, {"vision": 2}]),
        fair_share=st.booleans(),
        placement=st.sampled_from(["end-aligned", "best-fit"]),
    ),
)


# No example database: the suite leaves nothing behind in the checkout.
SETTINGS = settings(max_examples=int(os.environ.get("SCHEDULER_EXAMPLES", "200")), deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.one_of(scenarios(), contended()), POLICIES)
def test_plan_invariants(scenario, sched):
    capacity, running, pending, quotas = scenario
    plan = sched.schedule(NOW, pending, running, capacity, quotas)
    by_id = {j.id: j for j in pending}

    # Every pending job is either started or told why it waits, never both.
    started = [s.job_id for s in plan.starts]
    assert len(started) == len(set(started))
    assert set(started).isdisjoint(plan.waiting)
    assert set(started) | set(plan.waiting) == set(by_id)
    for reason in plan.waiting.values():
        assert reason.code in WAIT_CODES and reason.message

    # Whole gangs, one (node, gpus) per worker, on real nodes.
    for start in plan.starts:
        job = by_id[start.job_id]
        assert len(start.placement) == job.workers
        for node, gpus in start.placement:
            if job.gpus_per_worker > 0:
                assert node in capacity and gpus == job.gpus_per_worker
            else:
                assert (node, gpus) == ("", 0)

    # Never over-allocates a node (preempted jobs still hold their GPUs during this pass).
    used = holdings(capacity, running + as_allocations(plan, pending, NOW))
    assert all(used[n] <= capacity[n] for n in capacity)

    # Never takes a user or a group over quota (only jobs that start are checked: quotas may have
    # been lowered below what is already running).
    after = running + as_allocations(plan, pending, NOW)
    for user in {by_id[s].user for s in started if by_id[s].gpus}:
        limit = quotas.user_limit(user)
        if limit is not None:
            assert sum(a.gpus for a in after if a.user == user) <= limit
    for grp, cap in quotas.groups.items():
        if any(grp in by_id[s].groups and by_id[s].gpus for s in started):
            assert sum(a.gpus for a in after if grp in a.groups) <= cap

    # Deterministic.
    assert sched.schedule(NOW, pending, running, capacity, quotas) == plan


@SETTINGS
@given(st.one_of(scenarios(), contended()), POLICIES)
def test_backfill_never_delays_the_head(scenario, sched):
    capacity, running, pending, quotas = scenario
    plan = sched.schedule(NOW, pending, running, capacity, quotas)
    if plan.head is None:
        assert not any(s.backfill for s in plan.starts)
        return
    head = next(j for j in pending if j.id == plan.head)
    promised = plan.waiting[head.id].reserved_start
    left = [a for a in running if a.id not in plan.preempt]
    starts = as_allocations(plan, pending, NOW)
    backfilled = {s.job_id for s in plan.starts if s.backfill}
    in_order = [a for a in starts if a.id not in backfilled]
    without = reservation(NOW, head, capacity, left + in_order)
    with_backfill = reservation(NOW, head, capacity, left + starts)
    event(f"head, reservation {'held' if promised is not None else 'none'}, {len(backfilled)} backfilled")
    if promised is not None:
        assert promised == without  # the reported reservation is the true one
        assert with_backfill <= promised  # and backfill does not push it back
    if isinstance(sched, FifoGangScheduler):
        assert not backfilled


@SETTINGS
@given(st.one_of(scenarios(), contended()), POLICIES)
def test_preempts_only_preemptible_lower_priority_jobs(scenario, sched):
    capacity, running, pending, quotas = scenario
    plan = sched.schedule(NOW, pending, running, capacity, quotas)
    event(f"{len(plan.preempt)} preempted")
    if not plan.preempt:
        return
    assert isinstance(sched, TrainhubScheduler)
    head = next(j for j in pending if j.id == plan.head)
    by_id = {a.id: a for a in running}
    for victim_id in plan.preempt:
        victim = by_id[victim_id]
        assert victim.kind == "job" and victim.preemptible
        if victim.started_at > head.submitted_at and sched.preemptible_backfill:  # it overtook the head
            assert sched.base_priority(victim) <= sched.base_priority(head)
            assert sched.requeue_level(victim, NOW) <= sched.level(head, NOW)
        else:
            assert sched.base_priority(victim) < sched.base_priority(head)
            assert sched.requeue_level(victim, NOW) < sched.level(head, NOW)
    # The victims make room: the head fits once they are gone, and no victim is superfluous.
    starts = as_allocations(plan, pending, NOW)
    in_order = [a for a, st_ in zip(starts, plan.starts) if not st_.backfill]
    left = [a for a in running if a.id not in plan.preempt]
    assert _fits_now(head, capacity, left + starts)
    for victim_id in plan.preempt:
        assert not _fits_now(head, capacity, left + in_order + [by_id[victim_id]])


def _fits_now(job, capacity, allocations):
    used = holdings(capacity, allocations)
    return sum((capacity[n] - used[n]) // job.gpus_per_worker for n in capacity) >= job.workers
