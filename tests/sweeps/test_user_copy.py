"""Each user's own copy of their Optuna studies (services/sweeps/usercopy.py), with real Optuna storages and real
files: only the user's sweeps are copied, the file is written as the user through a UserTree (a link planted at
its path or at a folder on the way is never followed), the copy opens with ``optuna.load_study`` on
``trainhub.optuna_storage(home)`` and keeps its study ids and trial numbers across refreshes."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from types import SimpleNamespace

import optuna
import pytest

import trainhub
from trainhub.boundary.accounts import Account
from trainhub.boundary.asuser import AsUser
from trainhub.boundary.files import TreeError
from trainhub.runtime import OPTUNA_COPY
from trainhub.services.sweeps.models import study_name
from trainhub.services.sweeps.usercopy import StudyCopies

optuna.logging.set_verbosity(optuna.logging.WARNING)
AS_ROOT = os.geteuid() == 0
ALICE = Account("alice", "th-alice", 23901, 23901)


def sweep(n, user="alice", name="reg", state="running"):
    return SimpleNamespace(id=n, user=user, name=name, metric="val_loss", state=state)


def alices(*paths):
    """Folders a test makes in alice's home are hers, as if she had made them."""
    for p in paths:
        if AS_ROOT:
            os.lchown(p, ALICE.uid, ALICE.gid)


@pytest.fixture
def platform_storage(tmp_path):
    return optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'platform.db'}")


def add_study(storage, n, values, running=0):
    study = optuna.create_study(storage=storage, study_name=study_name(n), direction="minimize")
    study.set_user_attr("trainhub_sweep", f"s-{n:06d}")
    for v in values:
        t = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
        t.report(v * 2, 0)
        study.tell(t, v)
    for _ in range(running):
        study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
    return study


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "homes" / "alice"
    h.mkdir(parents=True)
    if AS_ROOT:
        os.chown(h, ALICE.uid, ALICE.gid)
    h.chmod(0o700)
    return h


@pytest.fixture
def copies(tmp_path, platform_storage, home):
    sweeps = {"alice": [sweep(1), sweep(3)], "bob": [sweep(2, user="bob")]}
    account = ALICE if AS_ROOT else None
    return StudyCopies(tmp_path / "data" / "optuna-copies", lambda: platform_storage,
                       lambda user: sweeps.get(user, []) + sweeps["bob"],  # a wrong answer: bob's must still stay out
                       lambda user: str(home) if user == "alice" else "", lambda user: AsUser(user, account),
                       logging.getLogger("test"))


def test_a_user_opens_their_own_studies_with_optuna_and_no_one_elses(copies, platform_storage, home):
    add_study(platform_storage, 1, [0.5, 0.2, 0.9])
    add_study(platform_storage, 2, [0.1])  # bob's
    add_study(platform_storage, 3, [0.3], running=1)
    path = copies.refresh("alice")
    assert path == str(home / OPTUNA_COPY)
    url = trainhub.optuna_storage(home)
    assert url == f"sqlite:///{home / OPTUNA_COPY}"
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage=url))
    assert names == ["s-000001", "s-000003"]
    study = optuna.load_study(study_name="s-000001", storage=url)
    assert [t.value for t in study.trials] == [0.5, 0.2, 0.9]
    assert study.best_value == 0.2
    assert study.trials[1].intermediate_values == {0: 0.4}
    assert study.user_attrs["trainhub_name"] == "reg"
    assert [t.state.name for t in optuna.load_study(study_name="s-000003", storage=url).trials] == ["COMPLETE", "RUNNING"]
    st = os.stat(home / OPTUNA_COPY)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    if AS_ROOT:  # written as the user: the file and the folders made for it are theirs
        assert (st.st_uid, st.st_gid) == (ALICE.uid, ALICE.gid)
        assert os.stat(home / ".trainhub" / "optuna").st_uid == ALICE.uid
    platform_file = next((copies.folder).iterdir())
    assert stat.S_IMODE(os.stat(copies.folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(platform_file).st_mode) == 0o600


def test_a_refresh_updates_running_trials_in_place_and_keeps_ids(copies, platform_storage, home):
    study = add_study(platform_storage, 1, [0.5], running=1)
    copies.refresh("alice")
    url = trainhub.optuna_storage(home)
    before = optuna.get_all_study_summaries(storage=url)[0]._study_id
    running = [t for t in study.get_trials() if t.state.name == "RUNNING"][0]
    study.tell(running.number, 0.05)
    add_study(platform_storage, 3, [0.7])
    copies.refresh("alice", [1, 3])
    copy = optuna.load_study(study_name="s-000001", storage=url)
    assert [(t.number, t.state.name, t.value) for t in copy.trials] == [(0, "COMPLETE", 0.5), (1, "COMPLETE", 0.05)]
    assert {s.study_name: s._study_id for s in optuna.get_all_study_summaries(storage=url)}["s-000001"] == before
    assert optuna.load_study(study_name="s-000003", storage=url).best_value == 0.7


def test_what_the_user_writes_into_the_copy_changes_nothing_on_the_platform(copies, platform_storage, home):
    add_study(platform_storage, 1, [0.5])
    copies.refresh("alice")
    url = trainhub.optuna_storage(home)
    optuna.load_study(study_name="s-000001", storage=url).enqueue_trial({"lr": 0.01})
    optuna.delete_study(study_name="s-000001", storage=url)
    assert [t.value for t in optuna.load_study(study_name=study_name(1), storage=platform_storage).trials] == [0.5]
    copies.refresh("alice", [1])  # the next refresh puts the study back
    assert [t.value for t in optuna.load_study(study_name="s-000001", storage=url).trials] == [0.5]


def test_a_link_planted_at_the_copys_path_is_replaced_never_followed(copies, platform_storage, home, tmp_path):
    add_study(platform_storage, 1, [0.5])
    target = tmp_path / "secret.db"
    target.write_bytes(b"the platform's secret")
    (home / ".trainhub" / "optuna").mkdir(parents=True)
    os.symlink(target, home / OPTUNA_COPY)
    alices(home / ".trainhub", home / ".trainhub" / "optuna", home / OPTUNA_COPY)
    copies.refresh("alice")
    assert target.read_bytes() == b"the platform's secret"
    assert not os.path.islink(home / OPTUNA_COPY)
    assert [s.study_name for s in optuna.get_all_study_summaries(storage=trainhub.optuna_storage(home))] == ["s-000001"]


@pytest.mark.parametrize("link", [".trainhub", ".trainhub/optuna"])
def test_a_link_in_place_of_a_folder_fails_the_refresh_and_writes_nothing_there(copies, platform_storage, home, tmp_path, link):
    add_study(platform_storage, 1, [0.5])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, home / link)
    alices(home / ".trainhub", home / link, elsewhere)  # she could write there: the link alone must stop it
    with pytest.raises((TreeError, OSError)):
        copies.refresh("alice")
    assert list(elsewhere.rglob("*")) == []


def test_no_home_no_copy_and_a_failed_refresh_is_logged_not_raised(copies, platform_storage, home, tmp_path, caplog):
    add_study(platform_storage, 2, [0.1])
    assert copies.refresh("bob") is None  # no home on this back end
    os.symlink(tmp_path, home / ".trainhub")

    async def go():
        copies.changed(sweep(1))
        await copies.idle()

    add_study(platform_storage, 1, [0.5])
    with caplog.at_level(logging.WARNING):
        asyncio.run(go())
    assert "was not refreshed" in caplog.text
