"""Reading a job's logs is bounded per pass: a log of any size is streamed in pieces, a tail reads only
the end of the files, and a line longer than a piece still moves the reading on."""

from trainhub.services.jobs.handlers import read_new, tail_lines


def stamped(i: int, worker: int, text: str = "") -> bytes:
    return f"[2026-11-24T04:{i // 60:02d}:{i % 60:02d}.{worker:06d}Z] w{worker} line {i} {text}\n".encode()


def write_logs(tmp_path, n: int, workers: int = 2, text: str = "") -> list:
    files = []
    for w in range(workers):
        f = tmp_path / f"worker-{w}.log"
        f.write_bytes(b"".join(stamped(i, w, text) for i in range(n)))
        files.append(f)
    return files


def test_a_large_log_is_read_whole_in_bounded_pieces(tmp_path):
    files = write_logs(tmp_path, 3000, text="x" * 200)  # ~1.4 MB over two files
    offsets, pieces = {}, []
    while chunk := read_new(files, offsets, budget=128 << 10):
        assert sum(map(len, chunk)) <= 128 << 10
        pieces.append(chunk)
    assert len(pieces) > 10
    lines = [line for chunk in pieces for line in chunk]
    assert sorted(lines) == sorted(line for f in files for line in f.read_bytes().splitlines(keepends=True))
    for chunk in pieces:  # each piece in time order
        assert chunk == sorted(chunk, key=lambda line: line[:24])


def test_a_line_longer_than_a_piece_is_passed_on_in_pieces(tmp_path):
    f = tmp_path / "worker-0.log"
    f.write_bytes(b"a" * (200 << 10) + b"\nend\n")
    offsets, out = {}, b""
    for _ in range(10):
        chunk = read_new([f], offsets, budget=64 << 10)
        if not chunk:
            break
        out += b"".join(chunk)
    assert out.replace(b"\n", b"") == b"a" * (200 << 10) + b"end" and offsets[f] == f.stat().st_size


def test_an_unfinished_line_waits_for_its_end(tmp_path):
    f = tmp_path / "worker-0.log"
    f.write_bytes(b"one\ntw")
    offsets = {}
    assert read_new([f], offsets) == [b"one\n"] and read_new([f], offsets) == []
    f.write_bytes(b"one\ntwo\n")
    assert read_new([f], offsets) == [b"two\n"]


def test_tail_reads_only_the_end_and_leaves_offsets_there(tmp_path):
    files = write_logs(tmp_path, 5000, text="y" * 100)
    offsets = {}
    last = tail_lines(files, 3, offsets, budget=64 << 10)
    assert [line.split(b"] ")[1].split()[:3] for line in last] == [[b"w1", b"line", b"4998"], [b"w0", b"line", b"4999"], [b"w1", b"line", b"4999"]]
    assert all(offsets[f] == f.stat().st_size for f in files)
    assert read_new(files, offsets) == []
    assert tail_lines(files, 0, {}) == []
    (tmp_path / "short").mkdir()
    short = write_logs(tmp_path / "short", 2, workers=1)  # fewer lines than asked: all of them, no piece of a line
    assert tail_lines(short, 10, {}) == short[0].read_bytes().splitlines(keepends=True)


async def test_a_few_unread_kib_are_read_on_the_loop_and_more_on_a_thread(tmp_path):
    """The follow a notebook's panel opens as its job starts reads on the event loop (a trip to a worker thread costs
    more than a few KiB, and shares the GIL with the start); a long log's unread part never blocks the loop."""
    import threading

    from trainhub.services.jobs.handlers import FOLLOW_CHUNK, JobLogsHandler, unread_bytes

    adir = tmp_path / "attempt-1"
    adir.mkdir()
    log = adir / "worker-0.log"

    def where(files):
        return threading.get_ident(), [f.name for f in files]

    assert await JobLogsHandler._on_files(where, str(tmp_path), None, {}) == (threading.get_ident(), [])  # no log yet
    log.write_bytes(stamped(0, 0))
    assert await JobLogsHandler._on_files(where, str(tmp_path), None, {}) == (threading.get_ident(), ["worker-0.log"])
    log.write_bytes(stamped(0, 0, "x" * FOLLOW_CHUNK))
    assert unread_bytes([log], {}) > FOLLOW_CHUNK
    thread, _ = await JobLogsHandler._on_files(where, str(tmp_path), None, {})
    assert thread != threading.get_ident()
    # what was read already does not count
    thread, _ = await JobLogsHandler._on_files(where, str(tmp_path), None, {log: log.stat().st_size - 10})
    assert thread == threading.get_ident()
