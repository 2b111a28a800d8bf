"""ShardReader's direct S3 path (trainhub.data.s3direct): presigned http.client GETs into one
buffer, no HEAD, byte ranges for large shards, retries, and the cases that keep s3fs."""

from __future__ import annotations

import http.server
import threading

import pytest
import s3fs

from trainhub.data import CorruptShardError, IndexNotFoundError, ShardNotFoundError, ShardReader, pack
from trainhub.data import s3direct
from trainhub.data.s3direct import DirectGetter, direct_getter


def _packed(make_samples, s3_options, bucket, n=30, size=3000, shard_size="20KB"):
    expected = make_samples(f"s3://{bucket}/raw", n, storage_options=s3_options, size=size)
    pack(f"s3://{bucket}/raw", f"s3://{bucket}/shards", shard_size=shard_size, storage_options=s3_options, progress=False)
    return expected


def _read(reader):
    return {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in reader}


@pytest.mark.parametrize("prefetch", [0, 3])
def test_direct_and_s3fs_paths_read_the_same_samples(make_samples, s3_options, s3_bucket, monkeypatch, prefetch):
    expected = _packed(make_samples, s3_options, s3_bucket)
    calls = []
    real_get = DirectGetter.get
    monkeypatch.setattr(DirectGetter, "get",
                        lambda self, path, size=None, **kw: calls.append(path) or real_get(self, path, size, **kw))
    direct = _read(ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, prefetch=prefetch))
    assert calls, "the direct path was not used on s3fs"
    n_direct = len(calls)
    plain = _read(ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, prefetch=prefetch,
                              direct_http=False))
    assert len(calls) == n_direct, "direct_http=False still used the direct path"
    assert direct == plain == expected
    assert all(isinstance(v, bytes) for sample in direct.values() for v in sample.values())


def test_shard_buffers_are_reused(make_samples, s3_options, s3_bucket, monkeypatch):
    from trainhub.data.reader import _Fetcher

    expected = _packed(make_samples, s3_options, s3_bucket, n=60, shard_size="12KB")
    fetchers = []
    real_close = _Fetcher.close
    monkeypatch.setattr(_Fetcher, "close", lambda self: fetchers.append(self) or real_close(self))
    reader = ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, prefetch=2)
    assert len(reader.shards) >= 12
    assert _read(reader) == expected
    (fetcher,) = fetchers
    assert 1 <= len(fetcher._ours) <= 2 + 2, "one buffer per shard in flight, then reuse"
    assert _read(ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, prefetch=0)) == expected
    assert len(fetchers[1]._ours) == 1


def test_large_shards_are_read_as_byte_ranges_without_head(make_samples, s3_options, s3_bucket, monkeypatch):
    expected = _packed(make_samples, s3_options, s3_bucket, n=20, size=5000, shard_size="60KB")
    reader = ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, prefetch=2)
    assert reader.shard_bytes and all(size > 4096 for size in reader.shard_bytes.values())
    monkeypatch.setattr(s3direct, "PART_SIZE", 4096)
    ranges = []
    real_range = DirectGetter._get_range
    monkeypatch.setattr(DirectGetter, "_get_range",
                        lambda self, url, path, view, a, b, size: ranges.append((path, a, b)) or real_range(
                            self, url, path, view, a, b, size))

    async def no_head(*args, **kwargs):
        raise AssertionError("the direct path must not ask for the object's size")

    monkeypatch.setattr(s3fs.S3FileSystem, "_info", no_head)
    assert _read(reader) == expected
    by_shard = {}
    for path, a, b in ranges:
        by_shard.setdefault(path, []).append((a, b))
    assert len(by_shard) == len(reader.shards)
    for path, parts in by_shard.items():
        size = reader.shard_bytes[f"s3://{path}"]
        assert sorted(parts)[0][0] == 0 and max(b for _, b in parts) == size
        assert sum(b - a for a, b in parts) == size and all(b - a <= 4096 for a, b in parts)


def test_shard_changed_after_packing_is_reported(make_samples, s3_options, s3_bucket, s3fs_fs):
    _packed(make_samples, s3_options, s3_bucket)
    s3fs_fs.pipe_file(f"{s3_bucket}/shards/shard-000001.tar", b"\0" * 1024)
    with pytest.raises(CorruptShardError, match=r"shard-000001\.tar has 1024 bytes but the shard index records \d+.*pack it again"):
        list(ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, prefetch=2))


def test_the_index_is_read_directly_unless_direct_http_is_off(make_samples, s3_options, s3_bucket, s3fs_fs,
                                                             monkeypatch):
    _packed(make_samples, s3_options, s3_bucket)
    from trainhub.data.storage import url_to_fs

    fs = url_to_fs(f"s3://{s3_bucket}/shards", s3_options)[0]  # the (cached) filesystem the reader gets
    through_s3fs, direct = [], []
    real_cat, real_get = fs.cat_file, DirectGetter.get
    monkeypatch.setattr(fs, "cat_file", lambda path, *a, **kw: through_s3fs.append(path) or real_cat(path, *a, **kw))
    monkeypatch.setattr(DirectGetter, "get", lambda self, path, *a, **kw: direct.append(path) or real_get(self, path, *a, **kw))
    reader = ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options)
    assert direct == [f"{s3_bucket}/shards/index.json"] and through_s3fs == []
    plain = ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, direct_http=False)
    assert through_s3fs == [f"{s3_bucket}/shards/index.json"] and len(direct) == 1
    assert plain.index == reader.index and reader.total_samples == 30
    with pytest.raises(IndexNotFoundError, match=rf"no index\.json at s3://{s3_bucket}/raw/index\.json"):
        ShardReader(f"s3://{s3_bucket}/raw", storage_options=s3_options)
    s3fs_fs.pipe_file(f"{s3_bucket}/shards/index.json", b"{not json")
    with pytest.raises(CorruptShardError, match="not valid JSON"):
        ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_missing_shard_on_the_direct_path(make_samples, s3_options, s3_bucket, s3fs_fs, prefetch):
    _packed(make_samples, s3_options, s3_bucket)
    s3fs_fs.rm_file(f"{s3_bucket}/shards/shard-000000.tar")
    with pytest.raises(ShardNotFoundError, match=r"shard-000000\.tar does not exist"):
        list(ShardReader(f"s3://{s3_bucket}/shards", storage_options=s3_options, prefetch=prefetch))


def test_direct_path_is_skipped_where_s3fs_must_do_the_request(s3_options, monkeypatch, tmp_path):
    import fsspec

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_options)
    assert isinstance(direct_getter(fs), DirectGetter)
    assert direct_getter(fsspec.filesystem("file")) is None
    assert direct_getter(s3fs.S3FileSystem(skip_instance_cache=True, requester_pays=True, **s3_options)) is None
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert direct_getter(fs) is None


class _FlakyStore(http.server.BaseHTTPRequestHandler):
    """Serves one object; the first GETs fail in the ways a real network does."""

    body = bytes(range(256)) * 64
    failures: list[str] = []
    seen: list[str] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.seen.append(self.command)
        mode = self.failures.pop(0) if self.failures else "ok"
        if mode == "503":
            payload = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        elif mode == "cut":
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(self.body[:1000])
            self.close_connection = True
        elif mode == "403":
            payload = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            self.send_response(403)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)


@pytest.fixture
def flaky_store():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyStore)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FlakyStore.failures, _FlakyStore.seen = [], []
    fs = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=f"http://127.0.0.1:{server.server_address[1]}",
                           key="k", secret="s")
    yield fs
    server.shutdown()
    server.server_close()


def test_transient_failures_are_retried(flaky_store, monkeypatch):
    monkeypatch.setattr(s3direct.time, "sleep", lambda s: None)
    _FlakyStore.failures = ["503", "cut"]
    getter = direct_getter(flaky_store)
    assert bytes(getter.get("b/obj")) == _FlakyStore.body
    assert _FlakyStore.seen == ["GET"] * 3


def test_errors_name_the_object_and_s3s_reason(flaky_store, monkeypatch):
    monkeypatch.setattr(s3direct.time, "sleep", lambda s: None)
    getter = direct_getter(flaky_store)
    _FlakyStore.failures = ["403"]
    with pytest.raises(PermissionError, match=r"s3://b/obj: access denied \(Access Denied\)"):
        getter.get("b/obj")
    _FlakyStore.failures = ["503"] * s3direct.ATTEMPTS
    with pytest.raises(OSError, match=r"GET s3://b/obj failed 3 times: HTTP 503: Please reduce your request rate"):
        getter.get("b/obj")


def test_new_filesystems_adopt_the_warm_session(s3_options):
    """A reader built in the parent warms its session; a worker's new filesystem with the same
    options (what a forked DataLoader worker gets) reuses it instead of building its own."""
    parent = s3fs.S3FileSystem(skip_instance_cache=True, **s3_options)
    s3direct.warm(parent)
    assert parent.session is not None
    worker = s3fs.S3FileSystem(skip_instance_cache=True, **s3_options)
    assert worker.session is None
    DirectGetter(worker)
    assert worker.session is parent.session
    other = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3_options["endpoint_url"], key="other", secret="x")
    DirectGetter(other)
    assert other.session is None, "a session must only go to a filesystem with the same options"


def test_forked_dataloader_workers_read_s3_directly(make_samples, s3_options, s3_bucket):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from trainhub.data import TorchShardDataset

    expected = _packed(make_samples, s3_options, s3_bucket, n=40)
    ds = TorchShardDataset(f"s3://{s3_bucket}/shards", shuffle_buffer=8, storage_options=s3_options)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = {s["__key__"]: {"jpg": s["jpg"], "json": s["json"]} for s in loader}
    assert got == expected


def _moment_free(url):
    return s3direct._moment_free(url)


def test_workers_presign_in_their_own_thread_with_the_parents_client(s3_options, s3_bucket, s3fs_fs):
    """With explicit keys, warm() makes a synchronous presigner that a worker's new filesystem
    signs with: the URL s3fs would give, and no async client built on the worker's side."""
    s3fs_fs.pipe(f"{s3_bucket}/obj", b"payload")
    parent = s3fs.S3FileSystem(skip_instance_cache=True, **s3_options)
    s3direct.warm(parent)
    worker = s3fs.S3FileSystem(skip_instance_cache=True, **s3_options)
    getter = DirectGetter(worker)
    assert getter._presigner is not None
    url = getter.sign(f"{s3_bucket}/obj")
    assert _moment_free(url) == _moment_free(parent.sign(f"{s3_bucket}/obj", expiration=s3direct.URL_EXPIRES))
    assert bytes(getter.get(f"{s3_bucket}/obj")) == b"payload"
    assert worker._s3 is None, "the worker built an async client just to sign"


def test_credentials_the_chain_resolves_keep_s3fs_signing(s3_options, monkeypatch):
    """No explicit keys (environment, profile, instance role), anonymous access, or a client
    that would sign differently: s3fs signs, as before."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_options["secret"])
    from_env = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3_options["endpoint_url"])
    assert s3direct._make_presigner(from_env) is None
    anon = s3fs.S3FileSystem(skip_instance_cache=True, anon=True, endpoint_url=s3_options["endpoint_url"])
    assert s3direct._make_presigner(anon) is None
    explicit = s3fs.S3FileSystem(skip_instance_cache=True, **s3_options)
    assert s3direct._make_presigner(explicit) is not None
    monkeypatch.setattr(explicit, "sign", lambda path, expiration=100: "http://elsewhere.invalid/" + path)
    assert s3direct._make_presigner(explicit) is None


def test_receive_buffer_only_where_the_kernel_allows_it(tmp_path, s3_options, s3_bucket, s3fs_fs, monkeypatch):
    """A fixed receive buffer turns autotuning off, so it is only asked for where
    net.core.rmem_max lets the socket have all of it."""
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_text(f"{s3direct.RECV_BUFFER // 2}\n")
    large.write_text(f"{s3direct.RECV_BUFFER}\n")
    assert s3direct._receive_buffer(str(small)) == 0
    assert s3direct._receive_buffer(str(large)) == s3direct.RECV_BUFFER
    assert s3direct._receive_buffer(str(tmp_path / "missing")) == 0
    if not s3direct._RECEIVE_BUFFER:
        pytest.skip("this machine's net.core.rmem_max is below RECV_BUFFER")
    import socket

    seen = []
    tune = s3direct._tune
    monkeypatch.setattr(s3direct, "_tune", lambda sock: (tune(sock), seen.append(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))))
    s3fs_fs.pipe(f"{s3_bucket}/obj", b"x" * 1000)
    getter = DirectGetter(s3fs.S3FileSystem(skip_instance_cache=True, **s3_options))
    assert bytes(getter.get(f"{s3_bucket}/obj")) == b"x" * 1000
    assert seen and all(size >= s3direct.RECV_BUFFER for size in seen)
