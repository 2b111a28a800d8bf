"""Quotas and profiles: pure rules, as tables."""

from __future__ import annotations

import pytest

from trainhub.exceptions import ProfileNotAllowed, QuotaExceeded, UnknownProfile
from trainhub.profiles import DEFAULT_PROFILES, Profile, ProfileCatalog
from trainhub.quotas import Demand, QuotaPolicy


@pytest.mark.parametrize(
    "policy, user, held, request_, ok",
    [
        ({}, "a", 7, 1, True),  # unlimited
        ({"user_gpu_limit": 2}, "a", 0, 2, True),
        ({"user_gpu_limit": 2}, "a", 1, 2, False),
        ({"user_gpu_limit": 2}, "a", 2, 0, True),  # CPU servers never count
        ({"user_gpu_limit": 2, "user_gpu_limits": {"a": 4}}, "a", 2, 2, True),
        ({"user_gpu_limit": 2, "user_gpu_limits": {"a": 4}}, "b", 2, 2, False),
        ({"user_gpu_limit": 0}, "a", 0, 1, False),
    ],
)
def test_user_limits(policy, user, held, request_, ok):
    q = QuotaPolicy(**policy)
    status = q.status(user, [], {user: held}, {})
    if ok:
        q.admit(Demand.server(user, (), request_), status)
    else:
        with pytest.raises(QuotaExceeded) as e:
            q.admit(Demand.server(user, (), request_), status)
        assert f"holds {held} of" in e.value.message and e.value.details["requested"] == request_


@pytest.mark.parametrize(
    "limits, groups, holdings, expect_remaining",
    [
        ({}, [], {"a": 1}, None),
        ({"students": 3}, ["students"], {"a": 1, "b": 1}, 1),
        ({"students": 3}, ["other"], {"a": 1, "b": 1}, None),
        ({"students": 3, "lab": 1}, ["students", "lab"], {"a": 0, "b": 1}, 0),
        ({"students": 3, "lab": 2}, ["students", "lab"], {"a": 0, "b": 1}, 1),
    ],
)
def test_group_status_remaining(limits, groups, holdings, expect_remaining):
    q = QuotaPolicy(group_gpu_limits=limits)
    members = {g: ["a", "b"] for g in groups}
    assert q.status("a", groups, holdings, members).remaining == expect_remaining


def test_remaining_is_tightest_limit():
    q = QuotaPolicy(user_gpu_limit=4, group_gpu_limits={"g": 3})
    s = q.status("a", ["g"], {"a": 1, "b": 1}, {"g": ["a", "b"]})
    assert s.remaining == 1 and s.to_dict()["limit"] == 4


def catalog(**kw):
    return ProfileCatalog(**kw)


def test_default_profiles_and_choice():
    c = catalog()
    assert [p.slug for p in c.all()] == ["cpu", "gpu-1", "gpu-2"]
    assert c.default().slug == "cpu" and c.cpu().slug == "cpu" and c.get(None).slug == "cpu"
    assert catalog(default_profile="gpu-1").default().slug == "gpu-1"
    gpu_only = catalog(profiles=[{"slug": "g", "gpus": 1}])
    assert gpu_only.default().slug == "g" and gpu_only.cpu() is None


def test_resolve_checks_groups():
    c = catalog(profiles=DEFAULT_PROFILES + [{"slug": "gpu-4", "gpus": 4, "allowed_groups": ["research"]}])
    assert c.resolve("gpu-4", ["research"]).gpus == 4
    assert c.resolve("gpu-4", [], is_admin=True).gpus == 4
    with pytest.raises(ProfileNotAllowed, match="research") as e:
        c.resolve("gpu-4", ["students"])
    assert e.value.status_code == 403
    with pytest.raises(UnknownProfile, match="Available profiles: cpu, gpu-1, gpu-2, gpu-4") as e:
        c.resolve("nope", [])
    assert e.value.status_code == 400
    assert [p.slug for p in c.for_user([])] == ["cpu", "gpu-1", "gpu-2"]


@pytest.mark.parametrize(
    "profiles, match",
    [
        ([{"slug": "Bad Slug"}], "slug"),
        ([{"slug": "a", "gpus": -1}], "gpus must be >= 0"),
        ([{"slug": "a", "colour": "red"}], "unknown field"),
        ([{"slug": "a"}, {"slug": "a"}], "duplicate"),
        ([], "at least one"),
    ],
)
def test_invalid_profiles_are_refused(profiles, match):
    with pytest.raises(Exception, match=match):
        catalog(profiles=profiles)


def test_profile_roundtrip():
    p = Profile.from_dict({"slug": "a100", "gpus": "2", "gpu_model": "A100", "allowed_groups": ["x"]})
    assert p.gpus == 2 and p.display_name == "a100" and p.allowed_groups == ("x",)
    assert Profile.from_dict(p.to_dict()) == p
    assert p.allows(["x"]) and not p.allows(["y"]) and p.allows([], is_admin=True)
