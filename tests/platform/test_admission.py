"""Admission (trainhub.quotas): the one rule for servers, jobs and trials, as tables.

The same :class:`Quotas` decides the 403s (``QuotaPolicy.admit``, used by the API's submit check,
the ledgers' atomic allocate and the spawners) and the scheduler's quota wait reasons; these
tables pin the rule and every text it produces.
"""

from __future__ import annotations

import pytest
from traitlets.config import Config

from trainhub.exceptions import QuotaExceeded
from trainhub.ledger import LocalGPUAllocator
from trainhub.quotas import Demand, QuotaPolicy, Quotas, Refusal, machine_cores
from trainhub.scheduler import Allocation, JobRequest, TrainhubScheduler

Q = Quotas(user_default=2, users={"big": 4}, groups={"lab": 3}, cpu_default=4, cpu_users={"cruncher": 16})


@pytest.mark.parametrize(
    "user, groups, need, held, group_held, expect",
    [
        # judged alone (held=None): only a request over a limit by itself is refused
        ("a", (), 2, None, None, None),
        ("a", (), 3, None, None, ("quota-user", 2, None)),
        ("big", (), 4, None, None, None),  # per-user override
        ("big", ("lab",), 4, None, None, ("quota-group", 3, None)),
        ("a", ("other",), 2, None, None, None),  # groups without a cap are uncapped
        ("a", (), 0, None, None, None),  # CPU-only asks no GPUs
        # with what is held now
        ("a", (), 1, 1, {}, None),
        ("a", (), 1, 2, {}, ("quota-user", 2, 2)),
        ("a", (), 0, 5, {}, None),  # nothing asked, nothing refused
        ("big", ("lab",), 1, 2, {"lab": 2}, None),
        ("big", ("lab",), 1, 2, {"lab": 3}, ("quota-group", 3, 3)),
        ("a", ("lab",), 1, 1, {"lab": 3}, ("quota-group", 3, 3)),  # the user's own limit passes first
        ("a", ("lab",), 2, 1, {"lab": 0}, ("quota-user", 2, 1)),  # ... and is reported first
    ],
)
def test_gpu_rule(user, groups, need, held, group_held, expect):
    r = Q.gpu_refusal(user, groups, need, held, group_held)
    if expect is None:
        assert r is None
    else:
        assert (r.code, r.limit, r.held) == expect and r.need == need and r.user == user


@pytest.mark.parametrize(
    "quotas, user, need, held, expect",
    [
        (Q, "a", 4, None, None),
        (Q, "a", 5, None, ("quota-cpu", 4, None)),
        (Q, "a", 1, 3, None),
        (Q, "a", 2, 3, ("quota-cpu", 4, 3)),
        (Q, "cruncher", 16, None, None),
        (Q, "cruncher", 44, None, ("quota-cpu", 16, None)),
        (Quotas(), "a", 64, 1000, None),  # the pure default is unlimited (the policy's is not)
        (Quotas(cpu_default=0), "a", 1, None, ("quota-cpu", 0, None)),
    ],
)
def test_cpu_rule(quotas, user, need, held, expect):
    r = quotas.cpu_refusal(user, need, held)
    assert (r if r is None else (r.code, r.limit, r.held)) == expect


@pytest.mark.parametrize(
    "refusal, message, wait_message",
    [
        (Refusal("quota-user", "alice", 3, 2, what="this job", detail=" (1 worker(s) × 3)"),
         "GPU quota exceeded: this job needs 3 GPUs (1 worker(s) × 3) but your quota is 2. "
         "Ask for fewer GPUs, or ask an admin to raise your quota.",
         "over quota: alice holds 0 of 2 GPUs and this job needs 3"),
        (Refusal("quota-user", "alice", 1, 2, 2),
         "GPU quota exceeded: alice holds 2 of 2 GPUs and asked for 1 more. "
         "Stop a server or job, or ask an admin to raise your quota.",
         "over quota: alice holds 2 of 2 GPUs and this job needs 1"),
        (Refusal("quota-group", "alice", 4, 3, group="lab", what="each trial"),
         "Group GPU quota exceeded: each trial needs 4 GPUs but group 'lab' may hold at most 3. "
         "Ask for fewer GPUs, or ask an admin to raise the group's quota.",
         "over group quota: lab holds 0 of 3 GPUs and each trial needs 4"),
        (Refusal("quota-group", "s1", 1, 2, 2, group="students"),
         "Group GPU quota exceeded: group 'students' holds 2 of 2 GPUs and s1 asked for 1 more. "
         "Wait until a server or job of the group stops, or ask an admin to raise the group's quota.",
         "over group quota: students holds 2 of 2 GPUs and this job needs 1"),
        (Refusal("quota-cpu", "alice", 44, 4),
         "CPU quota exceeded: this job needs 44 CPU-only worker processes but your quota is 4. "
         "Ask for fewer workers, or ask an admin to raise your quota.",
         "over CPU quota: alice runs 0 of 4 CPU-only workers and this job needs 44"),
        (Refusal("quota-cpu", "alice", 2, 4, 3),
         "CPU quota exceeded: alice runs 3 of 4 CPU-only worker processes and asked for 2 more. "
         "Wait until a job ends, or ask an admin to raise your quota.",
         "over CPU quota: alice runs 3 of 4 CPU-only workers and this job needs 2"),
    ],
)
def test_texts(refusal, message, wait_message):
    assert refusal.message == message
    assert refusal.wait_message == wait_message
    err = refusal.error()
    assert isinstance(err, QuotaExceeded) and err.status_code == 403 and err.message == message
    assert err.details["code"] == refusal.code and err.details["requested"] == refusal.need


@pytest.mark.parametrize(
    "demand, gpus, cpu_workers, what",
    [
        (Demand("a", (), 2, 3), 6, 0, "this job"),
        (Demand("a", (), 5, 0), 0, 5, "this job"),
        (Demand("a", (), 3, 0, "trial"), 0, 3, "each trial"),
        (Demand.server("a", ["g"], 0), 0, 0, "this server"),  # a CPU server is no CPU worker
        (Demand.server("a", ["g"], 2), 2, 0, "this server"),
    ],
)
def test_demand(demand, gpus, cpu_workers, what):
    assert (demand.gpus, demand.cpu_workers, demand.what) == (gpus, cpu_workers, what)


@pytest.mark.parametrize(
    "demand, match",
    [
        (Demand("a", (), 1, 2), None),
        (Demand("a", (), 1, 3), "GPU quota exceeded: this job needs 3 GPUs \\(1 worker\\(s\\) × 3\\) but your quota is 2"),
        (Demand("a", ("lab",), 2, 1, "trial"), None),
        (Demand("big", ("lab",), 2, 2, "trial"), "Group GPU quota exceeded: each trial needs 4 GPUs but group 'lab'"),
        (Demand("a", (), 4, 0), None),
        (Demand("a", (), 5, 0), "CPU quota exceeded: this job needs 5 CPU-only worker processes but your quota is 4"),
        (Demand("a", (), 5, 1), "GPU quota exceeded"),  # a GPU job's workers are bounded by GPUs, not CPU
        (Demand.server("a", (), 3), "GPU quota exceeded: this server needs 3 GPUs but your quota is 2"),
    ],
)
def test_admit_judges_a_request_alone(demand, match):
    policy = QuotaPolicy(user_gpu_limit=2, user_gpu_limits={"big": 4}, group_gpu_limits={"lab": 3},
                         user_cpu_worker_limit=4)
    if match is None:
        policy.admit(demand)
    else:
        with pytest.raises(QuotaExceeded, match=match):
            policy.admit(demand)


def test_admit_with_holdings_counts_the_group():
    policy = QuotaPolicy(group_gpu_limits={"students": 2})
    status = policy.status("s1", ["students"], {"s1": 1, "s2": 1}, {"students": ["s1", "s2"]})
    with pytest.raises(QuotaExceeded) as e:
        policy.admit(Demand.server("s1", ["students"], 1), status)
    assert e.value.message.startswith("Group GPU quota exceeded: group 'students' holds 2 of 2 GPUs and s1 asked for 1 more.")
    assert e.value.details == {"code": "quota-group", "user": "s1", "held": 2, "limit": 2, "requested": 1, "group": "students"}


def test_policy_options_have_help_and_a_sane_cpu_default():
    traits = QuotaPolicy.class_traits(config=True)
    assert {"user_gpu_limit", "user_gpu_limits", "group_gpu_limits", "user_cpu_worker_limit",
            "user_cpu_worker_limits"} <= set(traits)
    assert all(t.help for t in traits.values())
    policy = QuotaPolicy()
    assert policy.user_cpu_worker_limit == max(4, machine_cores()) and policy.user_gpu_limit is None
    c = Config()
    c.QuotaPolicy.user_cpu_worker_limit = None
    c.QuotaPolicy.user_cpu_worker_limits = {"alice": "8"}
    q = QuotaPolicy(config=c).quotas()
    assert q.cpu_limit("bob") is None and q.cpu_limit("alice") == 8
    q = QuotaPolicy(user_gpu_limit=2, user_gpu_limits={"a": 4}, group_gpu_limits={"g": "3"}).quotas()
    assert (q.user_limit("a"), q.user_limit("b"), dict(q.groups)) == (4, 2, {"g": 3})


def test_ledger_refuses_with_the_rule_text(tmp_path):
    """The ledger's atomic allocate and the pure rule say the same, word for word."""
    ledger = LocalGPUAllocator(db_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                               device_list=[{"index": i, "name": "sim", "uuid": f"GPU-{i}", "memory_total_mb": 1,
                                             "simulated": True} for i in range(4)])
    policy = QuotaPolicy(user_gpu_limit=2)
    ledger.allocate("server:a/", kind="server", user="a", count=2, quota=policy)
    with pytest.raises(QuotaExceeded) as e:
        ledger.allocate("job:1", kind="job", user="a", count=1, quota=policy)
    assert e.value.message == policy.quotas().gpu_refusal("a", (), 1, 2, {}).message


def test_scheduler_wait_reasons_come_from_the_rule():
    """GPU and CPU quota waits of the scheduler carry the rule's codes and texts."""
    quotas = QuotaPolicy(user_gpu_limit=2, user_cpu_worker_limit=4).quotas()
    running = [
        Allocation("s", "alice", (), (("n", 2),), kind="server"),
        Allocation("j-1", "carol", (), (("", 0),) * 3),  # a CPU-only job of 3 workers
    ]
    pending = [
        JobRequest("j-2", "alice", gpus_per_worker=1, submitted_at=1),
        JobRequest("j-3", "carol", workers=2, submitted_at=2),  # 3 + 2 > 4: waits
        JobRequest("j-4", "carol", workers=1, submitted_at=3),  # 3 + 1 = 4: starts
        JobRequest("j-5", "dan", workers=4, submitted_at=4),  # another user's quota: starts
    ]
    plan = TrainhubScheduler().schedule(10.0, pending, running, {"n": 8}, quotas)
    assert sorted(s.job_id for s in plan.starts) == ["j-4", "j-5"]
    assert plan.waiting["j-2"].code == "quota-user"
    assert plan.waiting["j-2"].message == quotas.gpu_refusal("alice", (), 1, 2, {}).wait_message
    assert plan.waiting["j-3"].code == "quota-cpu"
    assert plan.waiting["j-3"].message == "over CPU quota: carol runs 3 of 4 CPU-only workers and this job needs 2"
