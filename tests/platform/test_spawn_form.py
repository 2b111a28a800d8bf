"""The spawn page HTML and the non-GPU parts of the local spawner's decisions."""

from __future__ import annotations

import pytest

from trainhub.profiles import Profile
from trainhub.quotas import QuotaPolicy
from trainhub.spawner.profile_form import availability_text, render_form


@pytest.mark.parametrize(
    "profile, free, total, sim, text",
    [
        ({"slug": "cpu"}, 4, 4, True, "no GPU"),
        ({"slug": "g", "gpus": 1}, 3, 4, True, "3 of 4 GPUs free (simulated)"),
        ({"slug": "g", "gpus": 1}, 3, 4, False, "3 of 4 GPUs free"),
        ({"slug": "a", "gpus": 2, "gpu_model": "A100"}, 1, 2, False, "1 of 2 A100 GPUs free"),
    ],
)
def test_availability_text(profile, free, total, sim, text):
    assert availability_text(Profile.from_dict(profile), free, total, sim) == text


def test_form_marks_blocked_profiles_and_shows_quota():
    q = QuotaPolicy(user_gpu_limit=2)
    status = q.status("alice", [], {"alice": 1}, {})
    rows = [
        (Profile.from_dict({"slug": "cpu"}), 0, 4),
        (Profile.from_dict({"slug": "gpu-1", "gpus": 1}), 0, 4),
        (Profile.from_dict({"slug": "gpu-2", "gpus": 2}), 2, 4),
        (Profile.from_dict({"slug": "gpu-8", "gpus": 8}), 4, 4),
    ]
    html = render_form(rows, status, "cpu", True)
    assert "Your GPU quota: 1 of 2 remaining (you hold 1)." in html
    assert "not enough free GPUs right now" in html
    assert "over your quota (1 GPU left)" in html
    assert "needs 8 GPUs; this platform has 4" in html
    assert 'value="cpu" checked' in html


def test_with_a_queue_busy_gpus_are_a_wait_not_a_block():
    status = QuotaPolicy(user_gpu_limit=2).status("alice", [], {}, {})
    rows = [(Profile.from_dict({"slug": "gpu-1", "gpus": 1}), 0, 4), (Profile.from_dict({"slug": "gpu-8", "gpus": 8}), 4, 4)]
    html = render_form(rows, status, "gpu-1", True, queue=True)
    assert "all busy: it will wait in line" in html and "not enough free GPUs right now" not in html
    assert 'value="gpu-1" checked' in html and 'name="wait" value="on" id="trainhub-wait" checked' in html
    assert "needs 8 GPUs; this platform has 4" in html  # never fits: still a block
    assert 'name="wait"' not in render_form(rows, status, "gpu-1", True)


def test_form_escapes_admin_text():
    status = QuotaPolicy().status("a", [], {}, {})
    html = render_form([(Profile.from_dict({"slug": "x", "display_name": "<b>x</b>"}), 0, 0)], status, "x", False)
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert "no GPU quota applies to you" in html
