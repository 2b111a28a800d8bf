"""How servers and jobs of different users are kept apart on one machine (the embedded back end).

Two mechanisms, used together where the machine allows:

- **Unix accounts** (when `trainhub up` runs as root): each user's servers and jobs run as that
  user's own account (:mod:`trainhub.boundary.accounts`), their home and storage area owned by it (0700),
  ``datasets/`` owned by the platform and read-only to them, the data dir, its secrets and the
  databases readable by the platform alone.
- **A bubblewrap sandbox** per server and per job worker (``bwrap``, Debian's ``bubblewrap``):
  a private mount namespace showing read-only system folders (/usr, /etc, /sys), the Python
  interpreter, the virtualenv and trainhub's code; read-write only the user's home and storage
  area (a job: also its outputs folder and metrics file); ``datasets/`` read-only; a private
  /tmp and /dev/shm; /dev with only the GPU device nodes the ledger gave it (simulated devices
  have none). Its own pid namespace: it sees only its own processes, and all of them die with
  it (``--die-with-parent``), so none can outlive the platform. The network is the host's (the
  proxy reaches servers on loopback; servers and services authenticate every request).

As root the sandbox is set up first and the account switch happens inside it
(``setpriv --reuid``), so the account reaches the interpreter and code through the sandbox's
own folders even where their host parents are private (a venv under /root, a 0700 temporary
folder). Without root, ``bwrap`` uses an unprivileged user namespace.

Without either (not root, no bubblewrap) nothing separates users: the platform then serves
only one user (``Isolation.single_user``, the admin) unless ``Isolation.allow_shared_account``
says otherwise, loudly.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import threading
from typing import Iterable

from traitlets import Bool, CaselessStrEnum, Dict, Instance, List, Unicode, default
from traitlets.config import LoggingConfigurable

from trainhub.boundary.accounts import Account, UserAccounts, fs_identity, own_dir
from trainhub.exceptions import Forbidden

SYSTEM_RO = ("/usr", "/etc", "/sys")
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class Isolation(LoggingConfigurable):
    user_accounts = Bool(
        help="""Run each user's servers and jobs as their own Unix account (see UserAccounts). Default: True when
        `trainhub up` runs as root (it must: only root can switch accounts), else False. False as root runs
        everything as root, with no isolation between users.""",
    ).tag(config=True)

    @default("user_accounts")
    def _user_accounts_default(self):
        return os.geteuid() == 0

    sandbox = CaselessStrEnum(
        ["auto", "bwrap", "none"], "auto",
        help="""Sandbox each server and job worker with bubblewrap: "auto" when bwrap is installed, "bwrap" always
        (`trainhub up` refuses to start without it), "none" never. See docs/isolation.md for what a sandbox sees.""",
    ).tag(config=True)

    bwrap = Unicode(help="Path of the bwrap binary. Default: bwrap on PATH (Debian: apt-get install bubblewrap).").tag(config=True)

    @default("bwrap")
    def _bwrap_default(self):
        return shutil.which("bwrap") or ""

    setpriv = Unicode(help="Path of util-linux's setpriv, which switches to the user's account inside a sandbox. "
                      "Default: setpriv on PATH.").tag(config=True)

    @default("setpriv")
    def _setpriv_default(self):
        return shutil.which("setpriv") or "/usr/bin/setpriv"

    nsenter = Unicode(help="Path of nsenter (util-linux), which starts a user's processes in their network namespace.").tag(config=True)

    @default("nsenter")
    def _nsenter_default(self):
        return shutil.which("nsenter") or "/usr/bin/nsenter"

    allow_shared_account = Bool(
        False,
        help="""DANGER. Serve several users although nothing isolates them (not root, no bubblewrap): every user's
        servers and jobs then run as the one account that runs `trainhub up`, and any user can read and change
        every other user's files, job logs and the platform's secrets (its admin token included), and so act as
        admin. Only for a single person or a team that fully trusts each other. `trainhub up` prints a warning
        on every start. False (default): only Isolation.single_user may run servers and jobs then.""",
    ).tag(config=True)

    single_user = Unicode(
        "", help="Without isolation (and without allow_shared_account), the one user who may run servers and jobs. "
        "Set by `trainhub up` to its admin user.",
    ).tag(config=True)

    code_paths = List(
        Unicode(), help="Folders holding trainhub's code, visible read-only in every sandbox (besides the interpreter "
        "and the virtualenv). Set by `trainhub up` from where the trainhub packages were imported.",
    ).tag(config=True)

    ro_paths = List(
        Unicode(), help="More host folders visible read-only in every sandbox, for example ['/opt/cuda', '/opt/conda'].",
    ).tag(config=True)

    gpu_device_nodes = List(
        Unicode(), ["/dev/nvidia{minor}"],
        help="""Device nodes of one GPU, bound into the sandbox of a server or job holding it ({index}: the ledger
        index; {minor}: the device's minor number, the index unless NVML says otherwise). Nodes that do not exist
        are skipped (simulated devices have none).""",
    ).tag(config=True)

    device_minors = Dict(
        help="Ledger index -> the driver's minor number of each real GPU (from NVML); set by `trainhub up`.",
    ).tag(config=True)

    gpu_shared_nodes = List(
        Unicode(), ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"],
        help="Device nodes every holder of at least one GPU needs (the driver's control nodes). Missing ones are skipped.",
    ).tag(config=True)

    accounts = Instance(UserAccounts)

    @default("accounts")
    def _accounts_default(self):
        return UserAccounts(parent=self)

    # -- what is in force ---------------------------------------------------------------------
    @property
    def use_sandbox(self) -> bool:
        return self.sandbox == "bwrap" or (self.sandbox == "auto" and bool(self.bwrap))

    @property
    def use_accounts(self) -> bool:
        return self.user_accounts and os.geteuid() == 0

    @property
    def isolated(self) -> bool:
        """Users are kept apart (by accounts, by a sandbox, or both)."""
        return self.use_accounts or (self.use_sandbox and os.geteuid() != 0)

    @property
    def mode(self) -> str:
        """"accounts+sandbox", "accounts", "sandbox" or "none"."""
        if self.use_accounts:
            return "accounts+sandbox" if self.use_sandbox else "accounts"
        if self.use_sandbox and os.geteuid() != 0:
            return "sandbox"
        return "none"

    def problems(self) -> list[str]:
        """What keeps the platform from starting with this configuration (clear, actionable).

        As root, serving several users without a sandbox takes the admin's word for it: "auto" without bwrap is
        refused (accounts alone let every user see the machine's files as their account may, and every GPU node),
        ``c.Isolation.sandbox = "none"`` is that word."""
        out = []
        bwrap_ok = bool(self.bwrap and os.access(self.bwrap, os.X_OK))
        if self.sandbox == "bwrap" and not bwrap_ok:
            out.append("c.Isolation.sandbox = 'bwrap' but bwrap is not installed: apt-get install bubblewrap "
                       "(or set c.Isolation.bwrap to its path)")
        if self.user_accounts and os.geteuid() != 0:
            out.append("c.Isolation.user_accounts = True needs `trainhub up` to run as root")
        if self.use_accounts and self.use_sandbox and not os.access(self.setpriv, os.X_OK):
            out.append(f"{self.setpriv} (util-linux) is missing: it switches accounts inside sandboxes")
        if self.use_accounts and self.sandbox == "auto" and not bwrap_ok:
            out.append("running as root for several users needs bubblewrap (each user's servers and jobs in a sandbox "
                       "that sees only their own files and GPUs), and bwrap is not installed"
                       + (f" at {self.bwrap}" if self.bwrap else "") + ": install it (apt-get install bubblewrap, or "
                       "`make up`, which does), or set c.Isolation.sandbox = \"none\" in the platform config to run "
                       "with per-user accounts only (no sandbox: every user sees the machine's files as their account "
                       "may, and every GPU device node)")
        elif self.mode == "accounts":
            out += self._unreachable_without_sandbox()
        if self.use_accounts:
            out += self._unreadable_code()
        return out

    def _unreadable_code(self, limit: int = 5) -> list[str]:
        """Files of the interpreter, the virtualenv and trainhub's code that an account could not read (a checkout
        made with umask 077, a venv copied from root's home): every server of a user would die at its first import
        of them. A sandbox shows these folders at their own paths, so only their own modes matter (o+r files, o+rx
        folders); without a sandbox the parents count too (:meth:`_unreachable_without_sandbox`)."""
        bad: list[str] = []
        for top in dict.fromkeys([*self.interpreter_paths(), *self.code_paths]):
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
                for name, need in [(d, 0o005) for d in dirnames] + [(f, 0o004) for f in filenames if f.endswith((".py", ".so", ".json"))]:
                    path = os.path.join(dirpath, name)
                    try:
                        st = os.lstat(path)
                    except OSError:
                        continue
                    if not stat.S_ISLNK(st.st_mode) and st.st_mode & need != need:
                        bad.append(f"{path} ({stat.filemode(st.st_mode)})")
                        if len(bad) >= limit:
                            break
                if len(bad) >= limit:
                    break
            if len(bad) >= limit:
                break
        if not bad:
            return []
        tops = " ".join(dict.fromkeys([*self.interpreter_paths(), *self.code_paths]))
        return [f"users' accounts cannot read trainhub's code or its Python environment, so every server would fail to "
                f"start: {', '.join(bad)}{' and more' if len(bad) >= limit else ''}. Make them readable "
                f"(chmod -R o+rX {tops}) or install trainhub where every user may read it"]

    def _unreachable_without_sandbox(self) -> list[str]:
        """Without a sandbox an account must reach the interpreter, the venv and the code on the host itself."""
        probe = Account("probe", "probe", self.accounts.uid_max, self.accounts.uid_max)
        missing = []

        def check():
            for path in self.interpreter_paths() + list(self.code_paths):
                try:
                    with fs_identity(probe):
                        os.listdir(path)
                except OSError as e:
                    missing.append(f"{path} ({e.strerror})")

        t = threading.Thread(target=check)
        t.start()
        t.join()
        if missing:
            return [f"per-user accounts without a sandbox cannot reach {', '.join(missing)}: install bubblewrap "
                    "(apt-get install bubblewrap), which gives each account its own view of them, or install trainhub "
                    "where every user may read it (a venv outside /root)"]
        return []

    def check_user(self, username: str) -> None:
        """Refuse a second user on a platform that cannot isolate users (Forbidden, 403)."""
        if self.isolated or self.allow_shared_account or not self.single_user or username == self.single_user:
            return
        raise Forbidden(
            f"This platform cannot isolate users (it runs as an ordinary user and bubblewrap is not installed), so only "
            f"'{self.single_user}' may run servers and jobs. An admin can install bubblewrap (apt-get install bubblewrap) "
            "or run `trainhub up` as root; c.Isolation.allow_shared_account = True serves everyone without isolation "
            "(read the README's security notes first)."
        )

    def account(self, username: str) -> Account | None:
        """The user's account (created on demand) when accounts are on, else None."""
        return self.accounts.ensure(username) if self.use_accounts else None

    def describe(self, devices: list, run_as: str = "") -> list[str]:
        """Lines for `trainhub up`'s banner: the mode in force (:attr:`mode`), what separates users and what is not
        restricted."""
        lines = []
        tmpl = self.accounts.name_template.format(username="<user>")
        rng = f"uids {self.accounts.uid_min}-{self.accounts.uid_max}"
        mode = self.mode
        if mode == "accounts+sandbox":
            lines.append(f"  Isolation: accounts+sandbox: each user's servers and jobs run as their own Unix account ({tmpl}, "
                         f"{rng}) in a bubblewrap sandbox that sees only their home, their storage area and datasets/ "
                         "(read-only)")
        elif mode == "accounts":
            why = ("accounts only, as configured (c.Isolation.sandbox = \"none\")" if self.sandbox == "none"
                   else "accounts only (bubblewrap is not installed)")
            lines.append(f"  Isolation: {why}: each user's servers and jobs run as their own Unix account ({tmpl}, {rng}); "
                         "no sandbox: they see the machine's files as that account may")
        elif mode == "sandbox":
            lines.append("  Isolation: sandbox: each server and job runs in a bubblewrap sandbox that sees only its user's "
                         f"home, storage area and datasets/ (read-only); all run as {run_as or 'this account'} "
                         "(run `trainhub up` as root for per-user accounts)")
        elif self.allow_shared_account:
            lines.append(f"  WARNING: NO ISOLATION BETWEEN USERS (isolation: none). Every user's servers and jobs run as "
                         f"{run_as or 'this account'} without a sandbox: any user can read and change every other user's "
                         "files and the platform's secrets (c.Isolation.allow_shared_account = True). Install bubblewrap "
                         "or run as root.")
        else:
            lines.append(f"  Isolation: none available (not root, bubblewrap not installed): only '{self.single_user}' may "
                         "run servers and jobs. Install bubblewrap (apt-get install bubblewrap) or run as root to serve more users.")
        simulated = any(getattr(d, "simulated", False) for d in devices)
        if not devices:
            pass
        elif simulated:
            lines.append("  GPU devices: simulated, so there are no device nodes to restrict; each server and job is told "
                         "its devices by CUDA_VISIBLE_DEVICES only")
        elif self.use_sandbox:
            lines.append("  GPU devices: each sandbox holds only its ledger devices' nodes (/dev/nvidiaN) and the driver's "
                         "control nodes")
        else:
            lines.append("  GPU devices: NOT restricted (no sandbox): any process may open every /dev/nvidia* node; "
                         "CUDA_VISIBLE_DEVICES only names a holder's devices")
        return lines

    def user_areas(self, storage, username: str, account: Account | None, home: str) -> tuple[list[str], list[str]]:
        """Make the user's home and (local) storage area folders of theirs (0700), ``datasets/`` read-only to
        users, the storage root and ``users/`` traversable but not listable; returns the (read-write,
        read-only) paths a sandbox of theirs sees. Runs as the platform (root), on a worker thread."""
        own_dir(home, account, 0o700)
        rw, ro = [home], []
        if storage.url and storage.is_local:
            storage.ensure_layout([username])
            area = storage.strip(storage.user_url(username))
            own_dir(area, account, 0o700)
            datasets = storage.strip(storage.datasets_url())
            if account is not None:  # users reach their own area and datasets/ only, read datasets/ only
                for folder, mode in ((storage.strip(storage.root()), 0o711), (os.path.dirname(area), 0o711), (datasets, 0o755)):
                    st = os.stat(folder)
                    if st.st_uid != os.geteuid() and folder != datasets:
                        continue  # an admin's own arrangement of the storage root: leave it
                    os.chmod(folder, mode)
            rw.append(area)
            ro.append(datasets)
        return rw, ro

    # -- the sandbox --------------------------------------------------------------------------
    @staticmethod
    def interpreter_paths() -> list[str]:
        paths = [os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
                 os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]
        return list(dict.fromkeys(paths))

    def device_nodes(self, devices: Iterable[int]) -> list[str]:
        """Device nodes of the ledger devices ``devices`` (indices), the shared nodes included."""
        nodes = []
        for index in devices:
            minor = self.device_minors.get(index, index)
            for pattern in self.gpu_device_nodes:
                nodes.append(pattern.format(index=index, minor=minor))
        if nodes:
            nodes += list(self.gpu_shared_nodes)
        return list(dict.fromkeys(nodes))

    def sandbox_argv(self, cmd: list[str], *, account: Account | None, cwd: str, rw: Iterable[str] = (),
                     ro: Iterable[str] = (), devices: Iterable = ()) -> list[str]:
        """``cmd`` inside a sandbox: bwrap's arguments, then (with an account) setpriv's, then ``cmd``.

        ``rw``/``ro``: host paths (folders or files) visible at the same path, writable or not;
        ``devices``: the GPUs whose nodes it may open. The environment is the caller's (pass it to the
        process that runs this command): nothing secret goes on a command line, which every user can read.
        """
        argv = [self.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--new-session"]
        mounts: list[tuple[str, list[str]]] = []  # (destination, arguments), mounted parents first
        for p in SYSTEM_RO:
            if os.path.isdir(p):
                mounts.append((p, ["--ro-bind", p, p]))
        for p in SYSTEM_LINKS:
            if os.path.islink(p):
                argv += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                mounts.append((p, ["--ro-bind", p, p]))
        mounts.append(("/proc", ["--proc", "/proc"]))
        mounts.append(("/dev", ["--dev", "/dev"]))
        mounts.append(("/dev/shm", ["--perms", "01777", "--tmpfs", "/dev/shm"]))
        mounts.append(("/tmp", ["--perms", "01777", "--tmpfs", "/tmp"]))
        mounts.append(("/var/tmp", ["--perms", "01777", "--tmpfs", "/var/tmp"]))
        for p in [*self.interpreter_paths(), *self.code_paths, *self.ro_paths, *ro]:
            real = os.path.realpath(p)
            if os.path.exists(real):
                mounts.append((real, ["--ro-bind", real, real]))
        for p in rw:
            real = os.path.realpath(p)
            mounts.append((real, ["--bind", real, real]))
        for node in self.device_nodes(devices):
            mounts.append((node, ["--dev-bind-try", node, node]))
        argv += _ordered_mounts(mounts)
        argv += ["--chdir", os.path.realpath(cwd)]
        argv.append("--")
        return argv + self.as_account(account) + list(cmd)

    def as_account(self, account: Account | None) -> list[str]:
        """setpriv's arguments that run the rest of a command line as ``account`` ([] for None)."""
        if account is None:
            return []
        return [self.setpriv, f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups", "--no-new-privs", "--"]

    def command(self, cmd: list[str], *, account: Account | None, cwd: str, rw: Iterable[str] = (), ro: Iterable[str] = (),
                devices: Iterable[int] = (), netns: str | None = None) -> list[str]:
        """``cmd`` isolated as configured: in the user's network namespace (``netns``, a path such as
        /run/netns/th-alice), in a sandbox (as the account inside it), as the account, or as is."""
        enter = [self.nsenter, f"--net={netns}", "--"] if netns else []
        if self.use_sandbox:
            return enter + self.sandbox_argv(cmd, account=account, cwd=cwd, rw=rw, ro=ro, devices=devices)
        return enter + self.as_account(account) + list(cmd)


def _ordered_mounts(mounts: list[tuple[str, list[str]]]) -> list[str]:
    """bwrap arguments mounting parents before children, with the parents' folders created (0755) inside
    the sandbox's own root where no mount provides them; a path mounted twice keeps its first mount."""
    out: list[str] = []
    done: list[str] = []
    made: set[str] = {"/"}
    seen: set[str] = set()
    for dest, args in sorted(mounts, key=lambda m: (m[0].count("/"), m[0])):
        if dest in seen:
            continue
        seen.add(dest)
        parent = os.path.dirname(dest)
        chain = []
        while parent not in made and not any(parent == d or parent.startswith(d.rstrip("/") + "/") for d in done):
            chain.append(parent)
            parent = os.path.dirname(parent)
        for folder in reversed(chain):
            out += ["--perms", "0755", "--dir", folder]
            made.add(folder)
        out += args
        if args[0] in ("--ro-bind", "--bind", "--dev-bind-try"):  # the host's folders under it come along
            done.append(dest)
        else:  # a fresh tmpfs, proc or dev: empty, its sub-folders must be made
            made.add(dest)
    return out
