"""What the boundary tests share: the platform's secret, a hostile user's process (hostile.py) and
how files are laid out as a user. Imported by conftest.py and the tests."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

HOSTILE = Path(__file__).with_name("hostile.py")
SECRET = b"TOPSECRET-admin-password-0123456789"
SECRET_SIZE = 7777  # a size no legitimate test file has: a scan that counts it walked the secrets
MAX_ROUNDS = 24


@dataclass
class Place:
    root: Path
    secrets: Path
    platform: Path
    alice: Path
    bob: Path


def make_files(account, base: Path, files: dict[str, bytes]) -> None:
    """Files (and their folders) under ``base``, owned by ``account``."""
    for rel, data in files.items():
        path = base / rel
        for parent in reversed(path.relative_to(base).parents[:-1]):
            folder = base / parent
            if not folder.exists():
                folder.mkdir(mode=0o700)
                os.chown(folder, account.uid, account.gid)
        path.write_bytes(data)
        os.chown(path, account.uid, account.gid)


class Attacker:
    """hostile.py as ``account``, watching ``tree`` (passed as a descriptor: its parents are closed to it)."""

    def __init__(self, account, tree: Path, swaps: dict[str, str], at: int | None):
        self.fd = os.open(tree, os.O_PATH | os.O_DIRECTORY)
        # the script too goes in as a descriptor: the checkout may sit below a folder the account cannot enter
        self.script = os.open(HOSTILE, os.O_RDONLY)
        args = ["/usr/bin/python3", "-I", "-S", f"/proc/self/fd/{self.script}", str(self.fd)]
        args += [f"--swap={rel}={target}" for rel, target in swaps.items()]
        args += ["--count"] if at is None else [f"--at={at}"]
        cmd = ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups", "--", *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(self.fd, self.script),
                                     cwd="/", env={"PATH": "/usr/bin:/bin"})
        line = self.proc.stdout.readline().decode().strip()
        if line != "ready":
            raise RuntimeError(f"the hostile process did not start: {line!r} (exit {self.proc.poll()})")

    def finish(self) -> str:
        out, _ = self.proc.communicate(b"", timeout=30)
        os.close(self.fd)
        os.close(self.script)
        return out.decode()


def rounds(total: int) -> list[int]:
    """At most MAX_ROUNDS event counts spread over 1..total (every one when few)."""
    total = max(1, total)
    if total <= MAX_ROUNDS:
        return list(range(1, total + 1))
    step = total / MAX_ROUNDS
    return sorted({max(1, round(1 + i * step)) for i in range(MAX_ROUNDS)})
