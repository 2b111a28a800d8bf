"""Per-user Unix accounts on one machine (the embedded back end run as root).

As JupyterHub's ``LocalAuthenticator.create_system_users`` does, an account is created on demand
(``useradd``) the first time a user's server or job starts. Unlike it, a JupyterHub user maps to
a dedicated account, never to an existing system one:

- its name comes from ``UserAccounts.name_template`` (default ``th-{username}``); a user name
  that is not a portable Unix name (upper case, ``@``, ``.``..., or longer than 32 characters
  with the template) becomes its cleaned form plus a digest of the whole name;
- its uid and gid lie in ``uid_min..uid_max``; it has no password and no login shell;
- its comment (GECOS) is ``trainhub-user <username>`` (``trainhub-user #<digest>`` for names that
  /etc/passwd cannot hold: with ``:``, ``,`` or control characters). An existing account is used only when its uid
  is in the range *and* its comment names the same user, so no user is ever run as root, a
  system account, or another user's account (two names that clean to the same account name
  are refused, not merged).

:func:`fs_identity` makes one thread of the platform touch files as an account (``setfsuid``, no
supplementary groups): what the platform writes into a user's home or storage area is theirs, and what
it reads from there on their behalf (job outputs) is read with their rights only, refused by the kernel
where the user could not read it. :class:`trainhub.boundary.files.UserTree` uses it, with directory
descriptors, for every access to a user's folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import grp
import hashlib
import os
import pwd
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from traitlets import Bool, Integer, Unicode, validate
from traitlets.config import LoggingConfigurable

from trainhub.backoff import Backoff, WaitTimeout
from trainhub.exceptions import Forbidden, TrainhubError

UNIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]*$")
MAX_NAME = 32
COMMENT_PREFIX = "trainhub-user "


def account_comment(username: str) -> str:
    """The GECOS comment that marks an account as ``username``'s."""
    if username.isprintable() and not any(c in username for c in ":,=\\"):
        return COMMENT_PREFIX + username
    return COMMENT_PREFIX + "#" + hashlib.sha256(username.encode()).hexdigest()[:16]


class AccountError(TrainhubError):
    """The account of a user cannot be made or used (a configuration problem the admin must fix)."""

    status_code = 500
    reason = "account"


@dataclass(frozen=True)
class Account:
    """A user's Unix account: ``username`` is the JupyterHub name, ``name`` the Unix one."""

    username: str
    name: str
    uid: int
    gid: int


class UserAccounts(LoggingConfigurable):
    name_template = Unicode(
        "th-{username}",
        help="""Unix account name of a JupyterHub user; {username} is expanded. The result must be a
        portable Unix name ([a-z_][a-z0-9_-]*, at most 32 characters); a user name that does not fit
        is cleaned (lower case, other characters as '-') and given a 10-character digest of the whole
        name. Example: "th-{username}" gives th-alice; "{username}" uses the bare names (only for
        names that cannot collide with system accounts: the uid range check refuses those anyway).""",
    ).tag(config=True)
    uid_min = Integer(20000, help="Lowest uid (and gid) of trainhub's accounts. An existing account outside "
                      "uid_min..uid_max is never used for a user.").tag(config=True)
    uid_max = Integer(29999, help="Highest uid (and gid) of trainhub's accounts.").tag(config=True)
    create = Bool(True, help="Create missing accounts with useradd (False: they must exist, made by the admin with "
                  "the comment 'trainhub-user <username>'; a user without one is refused).").tag(config=True)
    useradd = Unicode("useradd", help="The useradd command (shadow-utils).").tag(config=True)
    shell = Unicode("/usr/sbin/nologin", help="Login shell of new accounts (servers and jobs never use it).").tag(config=True)

    @validate("name_template")
    def _check_template(self, proposal):
        template = proposal["value"]
        try:
            sample = template.format(username="a")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"UserAccounts.name_template {template!r} must use only {{username}}: {e}") from None
        if "{username}" not in template or not UNIX_NAME.match(sample):
            raise ValueError(f"UserAccounts.name_template {template!r} must contain {{username}} and give names "
                             "like th-alice ([a-z_][a-z0-9_-]*)")
        return template

    # -- names ---------------------------------------------------------------------------------
    def unix_name(self, username: str) -> str:
        name = self.name_template.format(username=username)
        if UNIX_NAME.match(name) and len(name) <= MAX_NAME:
            return name
        digest = hashlib.sha256(username.encode()).hexdigest()[:10]
        cleaned = re.sub(r"[^a-z0-9_-]+", "-", username.lower()).strip("-") or "u"
        head = self.name_template.format(username=cleaned)
        return f"{head[:MAX_NAME - len(digest) - 1]}-{digest}"

    # -- lookup and creation -------------------------------------------------------------------
    def lookup(self, username: str) -> Account | None:
        """The user's account if it exists (checked), else None."""
        name = self.unix_name(username)
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            return None
        self._check(pw, username)
        return Account(username, name, pw.pw_uid, pw.pw_gid)

    def ensure(self, username: str) -> Account:
        """The user's account, created when missing. Raises AccountError (or Forbidden when ``create`` is off)."""
        account = self.lookup(username)
        if account is not None:
            return account
        name = self.unix_name(username)
        if not self.create:
            raise Forbidden(f"{username} has no Unix account on this machine ({name}, comment '{account_comment(username)}'); "
                            "ask an admin to create it")
        self._useradd(name, username)
        account = self.lookup(username)
        if account is None:
            raise AccountError(f"useradd reported success but account {name} does not exist")
        self.log.info("created Unix account %s (uid %d) for %s", name, account.uid, username)
        return account

    def _check(self, pw, username: str) -> None:
        if not (self.uid_min <= pw.pw_uid <= self.uid_max and self.uid_min <= pw.pw_gid <= self.uid_max):
            raise AccountError(
                f"account {pw.pw_name} exists with uid {pw.pw_uid}/gid {pw.pw_gid}, outside trainhub's range "
                f"{self.uid_min}-{self.uid_max}: refusing to run {username}'s processes as it. Change "
                "UserAccounts.name_template or the range, or remove that account")
        owner = pw.pw_gecos.split(",", 1)[0]
        if owner != account_comment(username):
            raise AccountError(
                f"account {pw.pw_name} belongs to {owner or 'nobody known'!r}, not {account_comment(username)!r}: "
                f"refusing to run {username}'s processes as it (two user names map to one account?)")

    def _useradd(self, name: str, username: str) -> None:
        cmd = [self.useradd, "--no-create-home", "--home-dir", "/nonexistent", "--shell", self.shell, "--user-group",
               "--no-log-init", "--comment", account_comment(username),
               "-K", f"UID_MIN={self.uid_min}", "-K", f"UID_MAX={self.uid_max}",
               "-K", f"GID_MIN={self.uid_min}", "-K", f"GID_MAX={self.uid_max}",
               "-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0", name]
        pause = Backoff(f"useradd {name}", start=0.05, factor=2.0, cap=1.0, jitter=0.3, timeout=30)
        while True:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except FileNotFoundError:
                raise AccountError(f"{self.useradd} is not installed: cannot create accounts (Debian: apt-get install passwd)") from None
            if r.returncode == 0:
                return
            if r.returncode == 9:  # the name exists: another process (hub or jobs service) made it meanwhile
                return
            # 1/10: /etc/passwd or /etc/group locked by another useradd: try again
            if r.returncode in (1, 10) and "lock" in r.stderr.lower():
                try:
                    pause.sleep()
                    continue
                except WaitTimeout:
                    pass
            raise AccountError(f"useradd {name} failed ({r.returncode}): {r.stderr.strip()}")


# -- acting as an account on files -------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)


# setgroups(2) as a raw system call changes the calling thread's groups only (glibc's setgroups() changes every
# thread's, which would hand a root thread elsewhere in the process the account's groups)
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159, "ppc64le": 81, "s390x": 206}.get(os.uname().machine)


def _thread_setgroups(groups: list[int]) -> None:
    if _SYS_SETGROUPS is None:
        raise AccountError(f"cannot set one thread's groups on {os.uname().machine}")
    arr = (ctypes.c_uint * max(1, len(groups)))(*groups)
    if _libc.syscall(_SYS_SETGROUPS, len(groups), arr) != 0:
        e = ctypes.get_errno()
        raise AccountError(f"setgroups: {os.strerror(e)}")


@contextlib.contextmanager
def fs_identity(account: Account | None) -> Iterator[None]:
    """In this thread only, open/create/chmod files as ``account``: ``setfsuid``/``setfsgid`` (the kernel also
    drops the filesystem capabilities meanwhile) and no supplementary groups (root's group 0 would otherwise
    open files that are readable by that group). No-op for None or when not root. Keep the block free of
    awaits and thread switches: the identity belongs to the calling thread."""
    if account is None or os.geteuid() != 0:
        yield
        return
    old_groups = os.getgroups()  # the thread's own (getgroups reads the calling thread's credentials)
    _thread_setgroups([])
    old_gid = _libc.setfsgid(account.gid)
    old_uid = _libc.setfsuid(account.uid)
    try:
        if _libc.setfsuid(-1) != account.uid or _libc.setfsgid(-1) != account.gid:  # -1: query only
            raise AccountError(f"setfsuid({account.uid}) did not take effect")
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)
        _thread_setgroups(old_groups)


def own_dir(path: str | os.PathLike, account: Account | None, mode: int = 0o700) -> Path:
    """Make ``path`` (parents as the platform's) a folder of ``account`` with ``mode``.

    A folder that exists but is not the account's (made before accounts were on, or by a different
    name mapping) is handed over whole: its tree is chowned through descriptors, links changed themselves,
    never followed (trainhub.boundary.files.UserTree.chown_all). The folder itself is opened once, without
    following a link, and changed through that descriptor."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if account is not None and os.fstat(fd).st_uid != account.uid:
            from trainhub.boundary.files import UserTree

            with UserTree(path, None) as tree:
                tree.chown_all(account.uid, account.gid)
        if account is not None:
            os.fchown(fd, account.uid, account.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return path


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
