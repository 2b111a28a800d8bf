"""Fair work between users (issue 32): one user's flood of queued work that cannot start never stalls
another user's startable work while GPUs are free.

The pattern closed here: bob queues thousands of 3-GPU jobs that can never start (a notebook server holds
GPUs without a time limit), ahead of alice's 1-GPU job in queue order. Backfill examined only
``backfill_depth`` (1000) jobs behind the head, all of them bob's, so alice's job waited "behind" bob's
head while 2 of 4 GPUs were free. Past the depth, backfill now looks at every user's next jobs
(``TrainhubScheduler.backfill_per_user`` of them that do not start, per user), with the same EASY rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
from sqlalchemy import insert
from test_engine_passes import make_engine, submit  # noqa: F401  (make_engine: a fixture)

from trainhub.scheduler import Allocation, JobRequest, PendingQueue, Quotas, TrainhubScheduler
from trainhub.states import QUEUED, RUNNING

NOW = 100_000.0
FLOOD = 2000


def flood(n=FLOOD, user="bob", gpus=3, at=0.0) -> list[JobRequest]:
    """``n`` jobs of ``user`` queued before anyone else's, each too large for what the server leaves free."""
    prefix = "b" if user == "bob" else f"{user}-"
    return [JobRequest(f"{prefix}{i:05d}", user, (), 1, gpus, 0, at + i, 600.0) for i in range(n)]


def server(user="carol", gpus=2, node="n0") -> Allocation:
    """A notebook server: no time limit, so what it holds never comes back in a reservation."""
    return Allocation(f"{user}'s notebook server", user, (), ((node, gpus),), kind="server", started_at=0.0)


def alice(n=1, limit=600.0, at=50_000.0, gpus=1) -> list[JobRequest]:
    return [JobRequest(f"a{i}", "alice", (), 1, gpus, 0, at + i, limit) for i in range(n)]


@pytest.mark.parametrize("fair_share", [True, False])
@pytest.mark.parametrize("indexed", [True, False])
def test_one_users_flood_stalls_another_users_work_no_more(fair_share, indexed):
    """One user's flood stalls another's work: 2,000 unstartable jobs of bob ahead of alice's while 2 of 4
    GPUs are free. Alice's jobs start (as backfill); bob's head still holds its reason, the rest wait behind it."""
    pending = flood() + alice(2)
    sched = TrainhubScheduler(fair_share=fair_share)
    plan = sched.schedule(NOW, PendingQueue(pending) if indexed else pending, [server()], {"n0": 4}, Quotas())

    assert [(s.job_id, s.backfill) for s in plan.starts] == [("a0", True), ("a1", True)]
    assert plan.head == "b00000"
    head = plan.waiting["b00000"]
    assert head.code == "no-gpus" and "waiting for 3 GPUs: 2 of 4 free" in head.message
    assert "no start time can be promised" in head.message
    # the reasons stay true: every other job of bob waits behind his head, with the pass's final free count
    for job_id in ("b00001", "b00999", "b01000", f"b{FLOOD - 1:05d}"):
        why = plan.waiting[job_id]
        assert why.code == "behind" and why.blocking_job == "b00000", why
        assert why.message == "waiting for 3 GPUs: 0 of 4 free; behind job b00000 (priority 0)"
    assert len(plan.waiting) == FLOOD and set(dict(plan.waiting)) == {j.id for j in flood()}


def test_the_flood_is_passed_over_by_user_not_walked_through():
    """A pass past the depth costs O(users x backfill_per_user), not O(queue): the quota rule is asked once
    per job examined, and 20 users with 500 unstartable jobs each are examined a few jobs apiece."""

    @dataclass(frozen=True)
    class Counting(Quotas):
        asked: list = None

        def gpu_refusal(self, user, groups, need, held=None, group_held=None, **kw):
            self.asked.append(user)
            return super().gpu_refusal(user, groups, need, held, group_held, **kw)

    pending = []
    for u in range(20):
        pending += flood(500, user=f"u{u:02d}", at=u * 500.0)
    pending += alice(1)
    quotas = Counting(asked=[])
    sched = TrainhubScheduler(backfill_depth=100, backfill_per_user=3)
    plan = sched.schedule(NOW, PendingQueue(pending), [server()], {"n0": 4}, quotas)

    assert [s.job_id for s in plan.starts] == ["a0"]
    # u00's head and the 100 jobs of u00 behind it, then 3 more of u00 and 3 of every other user, and alice's
    assert len(quotas.asked) == 1 + 100 + 20 * 3 + 1
    assert [quotas.asked.count(f"u{u:02d}") for u in range(20)] == [1 + 100 + 3] + [3] * 19


def test_past_the_depth_backfill_still_never_delays_the_head():
    """EASY's guarantee holds for what is found past the depth: with the head reserved (reserve_after=0) at the
    end of a running job, alice's job that would run past the reservation waits ("reserved"), her short one starts
    (two of hers are looked at: backfill_per_user=2)."""
    running = [Allocation("r1", "carol", (), (("n0", 2),), started_at=NOW - 100, time_limit=1100.0)]  # ends at NOW + 1000
    pending = flood(1500) + [JobRequest("a-long", "alice", (), 1, 1, 0, 50_000.0, 5000.0),
                             JobRequest("a-short", "alice", (), 1, 1, 0, 50_001.0, 500.0)]
    sched = TrainhubScheduler(reserve_after=0.0, backfill_per_user=2)
    plan = sched.schedule(NOW, pending, running, {"n0": 4}, Quotas())

    assert [s.job_id for s in plan.starts] == ["a-short"]
    assert plan.waiting["b00000"].reserved_start == NOW + 1000
    why = plan.waiting["a-long"]
    assert why.code == "reserved" and why.blocking_job == "b00000", why
    assert NOW + 500.0 <= plan.waiting["b00000"].reserved_start  # a-short ends before the head's reserved start


def test_per_user_budget_zero_keeps_the_old_depth_cut():
    """``backfill_per_user = 0``: the pass stops at the depth, as before (alice waits for the next pass)."""
    plan = TrainhubScheduler(backfill_per_user=0).schedule(NOW, flood() + alice(1), [server()], {"n0": 4}, Quotas())
    assert plan.starts == ()
    assert plan.waiting["a0"].code == "behind"


def test_within_the_depth_nothing_changes():
    """A short queue never reaches the per-user part: the plan is the one of a pass without it."""
    pending = flood(50) + alice(3)
    a = TrainhubScheduler().schedule(NOW, pending, [server()], {"n0": 4}, Quotas())
    b = TrainhubScheduler(backfill_per_user=0).schedule(NOW, pending, [server()], {"n0": 4}, Quotas())
    assert a.starts == b.starts and dict(a.waiting) == dict(b.waiting)


# -- through the job engine (real store and ledger, 2 simulated GPUs) ----------------------------------------

def queue_rows(engine, n: int, user: str, gpus: int) -> None:
    """``n`` queued jobs of ``user`` in one insert (what n submissions leave in the table)."""
    base = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    rows = [dict(name=f"flood{i}", user=user, groups=[], state=QUEUED, reason="", gpus=gpus, workers=1, time_limit=600.0,
                 priority=0, preemptible=False, created=datetime.fromtimestamp(base + i, timezone.utc), env={}, devices=[],
                 exit_codes=[], launch_state={}, params={}, attempt=0, retries=0, cancel_requested=False)
            for i in range(n)]
    from trainhub.services.jobs.models import Job

    with engine.store.engine.begin() as conn:
        conn.execute(insert(Job), rows)


async def test_one_users_flood_stalls_another_users_work_no_more_in_the_engine(make_engine):  # noqa: F811
    """One user's flood stalls another's work, through the engine: a notebook server holds 1 of 2 GPUs, bob has
    1,500 queued 2-GPU jobs, alice submits a 1-GPU job with a time limit: it starts in the next pass."""
    engine = make_engine(schedule_interval=600)
    engine.allocator.allocate("server:carol", kind="server", user="carol", count=1)
    queue_rows(engine, 1500, "bob", 2)
    job = await submit(engine, user="alice", gpus=1, time_limit=600.0)
    await engine.run_once(schedule=True)
    row = await engine.store.read(engine.store.get, job.id)
    assert row.state == RUNNING, row.reason
    head = engine.why(1)
    assert head.code == "no-gpus" and "waiting for 2 GPUs: 1 of 2 free" in head.message
    last = engine.why(1500)
    assert last.code == "behind" and last.blocking_job == "j-000001", last
