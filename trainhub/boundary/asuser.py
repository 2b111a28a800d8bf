"""Acting as one user: the one door of the platform to a user's files, processes and network.

The services and the spawner never touch a user's folder, start a user's process or join a user's
network namespace themselves: they ask :class:`AsUser` (made by :meth:`AsUser.of` from the platform's
:class:`~trainhub.boundary.isolation.Isolation`) for

- ``tree(path)``: the folder as a :class:`~trainhub.boundary.files.UserTree` (as the user, by descriptors);
- ``command(cmd, ...)``: the argument vector that runs ``cmd`` as the user (network namespace, sandbox, account);

and :func:`storage_tree` maps a path of the local storage to the tree of whoever owns it (a user's
area to that user, ``datasets/`` and the rest to the platform), so a new feature reading from storage
gets the right identity without knowing the layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

from trainhub.boundary.accounts import Account
from trainhub.boundary.files import UserTree, parts_of


@dataclass
class AsUser:
    """One user, as the platform acts for them. ``account`` None: no per-user accounts (the platform's own
    identity, still without following links)."""

    username: str
    account: Account | None
    isolation: object | None = None  # trainhub.boundary.isolation.Isolation (not imported: it imports this module)

    @classmethod
    def of(cls, isolation, username: str) -> "AsUser":
        """The user as the platform's isolation says (their account is created on demand when accounts are on).
        Blocking (useradd): call it on a worker thread."""
        account = isolation.account(username) if isolation is not None else None
        return cls(username, account, isolation)

    def tree(self, path: str | os.PathLike, *, create: bool = False) -> UserTree:
        """The user's folder ``path`` (a home, a storage area, a job's outputs) opened for use as the user."""
        return UserTree(path, self.account, create=create)

    def command(self, cmd: list[str], *, cwd: str, rw: Iterable[str] = (), ro: Iterable[str] = (),
                devices: Iterable[int] = (), netns: str | None = None) -> list[str]:
        """``cmd`` as this user: in their network namespace (``netns``: a path such as /run/netns/th-alice), in a
        sandbox, as their account, as the isolation in force says."""
        if self.isolation is None:
            return list(cmd)
        return self.isolation.command(cmd, account=self.account, cwd=cwd, rw=rw, ro=ro, devices=devices, netns=netns)


def platform_tree(path: str | os.PathLike) -> UserTree:
    """A folder of the platform's own that users may have written into before (``datasets/`` as an admin filled it):
    walked as the platform, still by descriptors and without following a link."""
    return UserTree(path, None)


@dataclass(frozen=True)
class StoragePlace:
    """Where a local storage path lies: the tree's root, the path below it and whose tree it is (None: the platform's)."""

    root: str
    rel: str
    owner: str | None


def storage_place(storage, path: str) -> StoragePlace:
    """The tree that holds ``path`` (an absolute path in the local storage ``storage``, a StorageConfig)."""
    root = os.path.normpath(storage.strip(storage.root()))
    full = os.path.normpath(path)
    if full != root and not full.startswith(root + os.sep):
        raise ValueError(f"{path} is outside the storage at {root}")
    rel = "/".join(parts_of(os.path.relpath(full, root))) if full != root else ""
    parts = rel.split("/") if rel else []
    if len(parts) >= 2 and parts[0] == "users":  # an area's folder is named after its user (storage.user_url)
        return StoragePlace(os.path.join(root, "users", parts[1]), "/".join(parts[2:]), parts[1])
    if parts[:1] == ["datasets"]:
        return StoragePlace(os.path.join(root, "datasets"), "/".join(parts[1:]), None)
    return StoragePlace(root, rel, None)


def storage_tree(storage, isolation, path: str) -> tuple[UserTree, str]:
    """(tree, path below its root) for ``path`` in the local storage, opened as its owner. Blocking."""
    place = storage_place(storage, path)
    if place.owner is None:
        return platform_tree(place.root), place.rel
    return AsUser.of(isolation, place.owner).tree(place.root), place.rel
