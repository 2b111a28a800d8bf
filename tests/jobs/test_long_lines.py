"""A worker's output lines of any length reach its log in bounded work (services/jobs/worker.py, ``copy_output``).

The pattern these tests close is **one line without a newline**: a job writing 200 MiB and never a newline made the
wrapper join a growing buffer again for every read (quadratic), so the job blocked on its pipe for minutes with an
empty log. Now a line longer than ``LINE_CAP`` is cut into pieces of at most ``LINE_CAP`` bytes as it arrives (between
UTF-8 characters), each a timestamped log line of its own ending in ``CONTINUES`` but the last. Each test runs the
real wrapper (``python -S -P worker.py``, what the cold launcher starts; the warm fork server calls the same
``copy_output``) and reads the log as the jobs API does (``read_new``, ``tail_lines``).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import pytest
import requests

from trainhub.services.jobs import worker
from trainhub.services.jobs.handlers import FOLLOW_CHUNK, read_new, tail_lines
from trainhub.services.jobs.worker import CONTINUES, LINE_CAP, MAX_LOG_LINE

LINE = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[0\] ")
MARK = CONTINUES[:-1]  # b" [line continues]"


def run_worker(tmp_path, code: str, timeout: float = 240) -> bytes:
    """The wrapper running ``python -c code``; its log (the wrapper has finished and recorded exit code 0)."""
    log, exit_file = tmp_path / "worker-0.log", tmp_path / "worker-0.exit"
    r = subprocess.run([sys.executable, "-S", "-P", worker.__file__, "--rank", "0", "--log", str(log),
                        "--exit-file", str(exit_file), "--", sys.executable, "-c", code],
                       capture_output=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    assert exit_file.read_text() == "0"  # the job ran to its end: it never blocked on its pipe
    return log.read_bytes() if log.stat().st_size < 16 << 20 else b""


def texts(log: bytes) -> list[bytes]:
    """Each log line's text (time stamp and rank removed, its end kept: ``\\n`` or the marker)."""
    out = []
    for line in log.splitlines(keepends=True):
        m = LINE.match(line)
        assert m, f"not a timestamped log line: {line[:80]!r}"
        out.append(line[m.end():])
    return out


def joined(pieces: list[bytes]) -> bytes:
    """The output the pieces were cut from: the markers taken off the cut pieces."""
    return b"".join(p[:-len(CONTINUES)] if p.endswith(CONTINUES) else p for p in pieces)


def test_one_line_without_a_newline_of_200_mib_is_logged_whole_in_pieces(tmp_path):
    """One line without a newline, 200 MiB: the job finishes, and the log holds every byte, in pieces of at most
    LINE_CAP, each but the last marked as continued."""
    block = bytes(32 + i % 95 for i in range(1 << 20))  # printable ASCII, never a newline
    code = ("import sys\nblock = bytes(32 + i % 95 for i in range(1 << 20))\n"
            "for _ in range(200):\n    sys.stdout.buffer.write(block)\nsys.stdout.buffer.flush()\n")
    run_worker(tmp_path, code)
    expected = hashlib.sha256(block * 200).hexdigest()
    got, size, pieces = hashlib.sha256(), 0, 0
    with open(tmp_path / "worker-0.log", "rb") as log:
        last = b""
        for line in log:
            m = LINE.match(line)
            assert m and len(line) <= MAX_LOG_LINE, line[:80]
            text = line[m.end():]
            assert not last or last.endswith(CONTINUES)  # every piece before this one was marked
            body = text[:-len(CONTINUES)] if text.endswith(CONTINUES) else text[:-1]
            assert len(body) <= LINE_CAP and b"\n" not in body
            got.update(body)
            size += len(body)
            pieces += 1
            last = text
    assert last.endswith(b"\n") and not last.endswith(CONTINUES)  # the last piece ends the line
    assert size == 200 << 20 and got.hexdigest() == expected  # nothing lost, nothing added
    assert pieces == (200 << 20) // LINE_CAP


def test_a_line_of_exactly_the_cap_is_one_log_line_and_one_byte_more_is_two(tmp_path):
    log = run_worker(tmp_path, f"import sys\nsys.stdout.write('a' * {LINE_CAP} + '\\n' + 'b' * {LINE_CAP + 1} + '\\n')\n")
    assert texts(log) == [b"a" * LINE_CAP + b"\n", b"b" * LINE_CAP + CONTINUES, b"b\n"]


def test_a_cut_never_splits_a_utf8_character(tmp_path):
    """Characters of two, three and four bytes across the cap go whole into the next piece: each piece is text."""
    for char in ("é", "€", "𝄞"):
        size = len(char.encode())
        for before in range(1, size):  # the character would straddle the cap by that many bytes
            line = "a" * (LINE_CAP - before) + char + "z" * 10
            log = run_worker(tmp_path, f"import sys\nsys.stdout.write({line!r} + '\\n')\n")
            pieces = texts(log)
            assert pieces == [b"a" * (LINE_CAP - before) + CONTINUES, (char + "z" * 10 + "\n").encode()], (char, before)
            assert all(p.decode("utf-8") for p in pieces)
            (tmp_path / "worker-0.log").unlink()


def test_ordinary_lines_are_unchanged(tmp_path):
    out = "first\n\nsecond with ünïcödé\n" + "x" * 5000 + "\nno newline at the end"
    log = run_worker(tmp_path, f"import sys\nsys.stdout.write({out!r})\n")
    assert texts(log) == [b"first\n", b"\n", "second with ünïcödé\n".encode(), b"x" * 5000 + b"\n",
                          b"no newline at the end\n"]
    assert MARK not in log


def test_the_jobs_api_reads_split_lines_as_whole_log_lines(tmp_path):
    """A follow (``read_new`` with its small share, the loop's) and a tail hand out each piece as one log line."""
    count = 3 * LINE_CAP // 2  # two-byte characters: 3 × LINE_CAP bytes
    line = "".join(chr(0x400 + i % 200) for i in range(count))
    code = (f"import sys\nline = ''.join(chr(0x400 + i % 200) for i in range({count}))\n"
            "sys.stdout.write('before\\n' + line + '\\nafter\\n')\n")
    log = run_worker(tmp_path, code)
    files, offsets, lines = [tmp_path / "worker-0.log"], {}, []
    while chunk := read_new(files, offsets, FOLLOW_CHUNK):
        lines += chunk
    assert b"".join(lines) == log
    pieces = texts(b"".join(lines))  # every line handed out is a whole timestamped line
    assert len(pieces) == 5 and pieces[0] == b"before\n" and pieces[-1] == b"after\n"
    assert joined(pieces[1:4]).decode("utf-8") == line + "\n"
    assert all(p.endswith(CONTINUES) for p in pieces[1:3])
    last = tail_lines(files, 2, {})
    assert texts(b"".join(last)) == pieces[3:]


@pytest.mark.e2e
def test_a_jobs_long_line_reaches_a_follow_and_a_tail_in_pieces(platform):
    """Through a real `trainhub up`: a follow opened as the job starts (woken by the log watch) and a tail of its log
    through the jobs API get each piece of one line without a newline as one timestamped line."""
    url = platform.url + "/services/trainhub/api"
    h = {"Authorization": f"token {platform.token('longline')}"}
    size = 5 * LINE_CAP // 2
    spec = {"command": f"python -c \"import sys; sys.stdout.write('y' * {size}); sys.stdout.flush(); print(); print('done')\""}
    r = requests.post(url + "/jobs", json=spec, headers=h, timeout=30)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    with requests.get(f"{url}/jobs/{jid}/logs", params={"follow": 1}, headers=h, stream=True, timeout=120) as r:
        followed = b"".join(r.iter_content(None))
    assert requests.get(f"{url}/jobs/{jid}", headers=h, timeout=30).json()["state"] == "succeeded"
    pieces = texts(followed)
    assert pieces[-1] == b"done\n" and len(pieces) == 4, pieces[-1]
    assert joined(pieces[:3]) == b"y" * size + b"\n" and [p.endswith(CONTINUES) for p in pieces[:3]] == [True, True, False]
    tail = requests.get(f"{url}/jobs/{jid}/logs", params={"tail": 2}, headers=h, timeout=30).content
    assert texts(tail) == pieces[2:]
