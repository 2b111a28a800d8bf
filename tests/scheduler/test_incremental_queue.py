"""The indexed pending queue and the lazily explained reasons give exactly the plans of the old eager pass.

``policy_before`` is the policy module as it was when every pass sorted the whole queue and worked
out every waiting job's reason; it is the oracle here.
"""

from __future__ import annotations

import random

import policy_before
from hypothesis import given
from hypothesis import strategies as st
from test_scheduler_properties import NOW, POLICIES, SETTINGS, contended, scenarios

from trainhub.scheduler import FifoGangScheduler, JobRequest, Quotas, TrainhubScheduler
from trainhub.scheduler.queue import PendingQueue

TRAITS = ("aging_interval", "aging_max", "reserve_after", "backfill", "backfill_depth", "backfill_per_user", "group_priorities",
          "fair_share", "preemption", "max_cpu_jobs", "placement")


def oracle(sched):
    if isinstance(sched, FifoGangScheduler):
        return policy_before.FifoGangScheduler(max_cpu_jobs=sched.max_cpu_jobs)
    return policy_before.TrainhubScheduler(**{t: getattr(sched, t) for t in TRAITS})


def same_plan(new, old):
    assert new.starts == old.starts
    assert new.preempt == old.preempt
    assert new.head == old.head
    assert dict(new.waiting) == dict(old.waiting)
    assert set(new.waiting) == set(old.waiting) and len(new.waiting) == len(old.waiting)


def shuffled_queue(pending, seed: int) -> PendingQueue:
    """The same jobs reached by adds in another order, a removal and a re-add on the way."""
    rng = random.Random(seed)
    jobs = list(pending)
    rng.shuffle(jobs)
    queue = PendingQueue()
    for job in jobs:
        queue.add(job)
    if jobs:
        victim = rng.choice(jobs)
        queue.remove(victim.id)
        queue.add(victim)
    return queue


@SETTINGS
@given(st.one_of(scenarios(), contended()), POLICIES, st.integers(0, 1000))
def test_same_plan_as_the_eager_pass(scenario, sched, seed):
    capacity, running, pending, quotas = scenario
    old = oracle(sched).schedule(NOW, pending, running, capacity, quotas)
    same_plan(sched.schedule(NOW, pending, running, capacity, quotas), old)
    same_plan(sched.schedule(NOW, shuffled_queue(pending, seed), running, capacity, quotas), old)


@SETTINGS
@given(st.one_of(scenarios(), contended()), POLICIES)
def test_each_lazy_reason_alone_equals_the_eager_one(scenario, sched):
    """Asking for one job's reason (as GET /jobs/{id}/why does) gives what the eager pass gave it."""
    capacity, running, pending, quotas = scenario
    old = oracle(sched).schedule(NOW, pending, running, capacity, quotas)
    for job in pending:
        plan = sched.schedule(NOW, pending, running, capacity, quotas)
        assert plan.waiting.get(job.id) == old.waiting.get(job.id)
        assert (job.id in plan.waiting) == (job.id in old.waiting)


def long_queue(n: int, seed: int = 1) -> list[JobRequest]:
    rng = random.Random(seed)
    return [JobRequest(f"q{i}", f"u{rng.randrange(20)}", (f"g{rng.randrange(3)}",), 1, rng.choice([1, 2, 4, 8]),
                       rng.choice([0, 0, 1, 5]), rng.uniform(0, NOW), rng.choice([None, 600.0, 3600.0]), rng.random() < 0.3)
            for i in range(n)]


def test_long_queue_matches_and_a_job_queued_after_the_pass_is_not_in_it():
    capacity = {f"n{i}": 8 for i in range(4)}
    pending = long_queue(3000)
    sched = TrainhubScheduler(backfill_depth=50)
    old = oracle(sched).schedule(NOW, pending, [], capacity, Quotas())
    queue = PendingQueue(pending)
    plan = sched.schedule(NOW, queue, [], capacity, Quotas())
    late = JobRequest("late", "u1", (), 1, 1, submitted_at=NOW)
    queue.add(late)
    for start in plan.starts:
        queue.remove(start.job_id)
    assert "late" not in plan.waiting and plan.waiting.get("late") is None
    same_plan(plan, old)
    assert sum(1 for _ in plan.waiting) == len(plan.waiting) == len(pending) - len(plan.starts)


def test_queue_keeps_every_job_once_through_adds_and_removals():
    rng = random.Random(7)
    queue, expected = PendingQueue(), {}
    jobs = long_queue(500, seed=3) + [JobRequest(f"c{i}", "u0", workers=1, gpus_per_worker=0) for i in range(20)]
    for _ in range(3000):
        job = rng.choice(jobs)
        if rng.random() < 0.5:
            queue.add(job)
            expected[job.id] = job
        else:
            assert (queue.remove(job.id) is not None) == (expected.pop(job.id, None) is not None)
    assert {j.id for j in queue} == set(expected) and len(queue) == len(expected)
    assert queue.gpu_jobs == sum(1 for j in expected.values() if j.gpus_per_worker > 0)
    for lists in queue.lanes(fair_share=False) + queue.lanes(fair_share=True):
        for lst in lists:
            assert lst == sorted(lst, key=lambda e: (e[0], e[1])) and lst


def test_a_job_twice_in_the_pending_jobs_is_refused():
    job = JobRequest("a", "u")
    try:
        PendingQueue([job, job])
    except ValueError as e:
        assert "twice" in str(e)
    else:
        raise AssertionError("a duplicate id was accepted")
