"""A hostile user's process: watches their own folder with inotify and swaps things for symbolic links
at the moment the platform touches them.

    python3 hostile.py ROOT_FD --swap REL=TARGET [--swap ...] (--at N | --count)

``ROOT_FD``: an inherited descriptor of the user's folder (its parents may be closed to the account).
Every folder below it is watched (new ones too). At the N-th open/access event the platform causes
(``IN_OPEN``, ``IN_ACCESS``, ``IN_CLOSE_NOWRITE`` on any watched folder), each ``REL`` (a file or a
folder, relative to ROOT) is renamed aside and replaced by a symbolic link to ``TARGET``; with
``--count`` it only counts events until stdin closes and prints the count. It prints ``ready`` once
its watches are in place and ``swapped N`` when it swapped. Standard library only (it runs with the
system's python3 as the user's account, as any user's process could).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import struct
import sys

IN_ACCESS, IN_OPEN, IN_CLOSE_NOWRITE, IN_CREATE, IN_ISDIR = 0x1, 0x20, 0x10, 0x100, 0x40000000
MASK = IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE | IN_CREATE

libc = ctypes.CDLL(None, use_errno=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root_fd", type=int)
    ap.add_argument("--swap", action="append", default=[])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--at", type=int)
    mode.add_argument("--count", action="store_true")
    args = ap.parse_args()
    root = f"/proc/self/fd/{args.root_fd}"
    ifd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if ifd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    watches: dict[int, str] = {}

    def watch(path: str) -> None:
        wd = libc.inotify_add_watch(ifd, path.encode(), MASK)
        if wd >= 0:
            watches[wd] = path

    for dirpath, dirnames, _ in os.walk(root):
        watch(dirpath)
    swaps = [s.split("=", 1) for s in args.swap]
    print("ready", flush=True)
    events = 0
    swapped = False
    while True:
        r, _, _ = select.select([ifd, sys.stdin], [], [], 30)
        if sys.stdin in r and not sys.stdin.buffer.read1(1):
            break
        if ifd not in r:
            continue
        data = os.read(ifd, 1 << 16)
        i = 0
        while i < len(data):
            wd, mask, _cookie, length = struct.unpack_from("iIII", data, i)
            name = data[i + 16:i + 16 + length].rstrip(b"\0").decode()
            i += 16 + length
            if mask & IN_CREATE and mask & IN_ISDIR and wd in watches:
                watch(os.path.join(watches[wd], name))
                continue
            if not mask & (IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE):
                continue
            events += 1
            if args.at is not None and not swapped and events >= args.at:
                for rel, target in swaps:
                    victim = os.path.join(root, rel)
                    try:
                        os.rename(victim, victim + ".moved")
                    except FileNotFoundError:
                        pass
                    os.symlink(target, victim)
                swapped = True
                print(f"swapped {events}", flush=True)
    if args.count:
        print(f"count {events}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
