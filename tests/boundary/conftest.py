"""Fixtures of the boundary tests: two users' real Unix accounts, their folders, the platform's
secrets, and a hostile process (hostile.py, driven by swapkit.Attacker) that watches a user's folder
with inotify and swaps things for symbolic links while the platform works in it.

- ``accounts``: ``alice`` and ``bob`` as trainhub would create them (root only; skipped otherwise);
- ``place``: a fresh layout per test: ``secrets/`` (the platform's, 0700, with ``admin-password``),
  ``platform/`` (a platform folder a write must never reach), alice's and bob's folders (0700 each);
- ``attack``: runs an operation once per event count N, the attacker swapping at the N-th open it sees.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from swapkit import SECRET, SECRET_SIZE, Attacker, Place, rounds


@pytest.fixture(scope="session")
def accounts():
    if os.geteuid() != 0:
        pytest.skip("per-user accounts need root")
    if not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"):
        pytest.skip("setpriv and the system python3 run the hostile user's process")
    from trainhub.boundary.accounts import UserAccounts

    ua = UserAccounts()
    return {name: ua.ensure(name) for name in ("alice", "bob")}


@pytest.fixture
def place(tmp_path, accounts) -> Place:
    root = tmp_path / "data"
    root.mkdir(mode=0o700)
    secrets = root / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "admin-password").write_bytes(SECRET)
    (secrets / "padding.bin").write_bytes(SECRET[:1] * SECRET_SIZE)
    os.chmod(secrets / "admin-password", 0o600)
    platform = root / "platform"
    platform.mkdir(mode=0o755)
    (platform / "keep.txt").write_bytes(b"platform file")
    homes = {}
    for name, acct in accounts.items():
        d = root / name
        d.mkdir(mode=0o700)
        os.chown(d, acct.uid, acct.gid)
        homes[name] = d
    (homes["bob"] / "bobs-notes.txt").write_bytes(b"bob's own " + SECRET)
    os.chown(homes["bob"] / "bobs-notes.txt", accounts["bob"].uid, accounts["bob"].gid)
    return Place(root, secrets, platform, homes["alice"], homes["bob"])


@pytest.fixture
def attack():
    """attack(account, tree, swaps, setup, operation, check): for each event count N the platform causes in
    ``tree`` (counted in a first, quiet round), ``setup()`` lays the tree out afresh, the attacker swaps each
    of ``swaps`` (path under tree -> link target) at the N-th event, ``operation()`` runs (its exception, if
    any, is passed to ``check``) and ``check(error)`` asserts nothing crossed. Returns the rounds run."""

    def run(account, tree: Path, swaps: dict[str, str], setup, operation, check) -> list[int]:
        setup()
        counter = Attacker(account, tree, {}, None)
        try:
            operation()
        except Exception:
            pass
        out = counter.finish()
        total = int(out.split("count", 1)[1]) if "count" in out else 1
        done = []
        for n in rounds(total):
            setup()
            attacker = Attacker(account, tree, swaps, n)
            error = None
            try:
                operation()
            except Exception as e:  # a refusal is fine; what matters is what crossed
                error = e
            attacker.finish()
            check(error)
            done.append(n)
        return done

    return run
