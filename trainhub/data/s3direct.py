"""Shard downloads from S3 over plain HTTP: :class:`DirectGetter`.

``ShardReader`` reads whole shards. Through s3fs each one costs a HEAD (s3fs asks for the
size to decide whether to split the GET), then a GET whose body aiohttp hands over in small
chunks that are joined at the end: on a fast store the client's CPU, not the network, sets
the pace. This module does the same GET with less work:

- the request is presigned locally by the filesystem's own botocore client (the same
  credentials, session token, endpoint, region and addressing style as every other s3fs
  call; nothing goes over the network to sign);
- it is sent with :mod:`http.client` from the calling thread (which releases the GIL while
  it waits), with no HEAD: the size comes from the shard index when known, else from the
  GET's own ``Content-Length``;
- the body is read straight into one preallocated buffer (``readinto``, no chunk list and
  no join);
- objects larger than ``part_size`` whose size is known are fetched as parallel byte-range
  GETs into slices of that same buffer;
- a botocore session set up in the parent process (:func:`warm`, called when a reader is
  built) is adopted by the filesystems of forked DataLoader workers, which otherwise spend
  0.1-0.5 s per worker and epoch parsing botocore's service models before the first GET;
- with explicit static credentials, :func:`warm` also makes a synchronous botocore client
  that forked workers inherit and presign with in their own thread: s3fs's ``sign`` runs on
  its event loop thread, and a worker's first call there builds an async client (10-20 ms
  before the first GET, then a thread hop for every shard);
- where the kernel allows it (``net.core.rmem_max``), each connection gets a
  ``RECV_BUFFER`` receive buffer: a fast store then sends a shard in fewer, larger writes
  than through a window that autotuning grows from 128 KiB.

:func:`direct_getter` returns ``None`` (use s3fs) when the filesystem is not s3fs, when its
requests need extra parameters (requester pays, SSE-C keys...), or when an HTTP proxy applies
to the endpoint: those cases keep s3fs's full client.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .exceptions import CorruptShardError

log = logging.getLogger(__name__)

#: Objects larger than this (when their size is known) are fetched as ranges of this size.
PART_SIZE = 8 * 2**20
#: Range requests of one reader in flight at once, across all its shards.
MAX_PARTS_IN_FLIGHT = 8
#: Lifetime of a presigned URL; one URL serves all ranges of one shard.
URL_EXPIRES = 3600
#: Receive buffer asked for each connection, when ``net.core.rmem_max`` allows that much.
#: Setting one turns off the kernel's autotuning for the socket, so a smaller cap is left alone.
RECV_BUFFER = 4 * 2**20
ATTEMPTS = 3
TIMEOUT = 60.0

_RETRY_STATUS = frozenset({500, 502, 503, 504})
_S3_MESSAGE = re.compile(rb"<Message>(.*?)</Message>", re.S)


class _Retry(Exception):
    """A transient failure worth another attempt (connection reset, 5xx, short body)."""


#: botocore sessions by filesystem options, set up in this process or inherited from the
#: parent through fork (a session holds credentials and parsed models, no sockets).
_SESSIONS: dict[tuple, Any] = {}
#: Synchronous botocore clients that presign for a filesystem's options (None: use s3fs's
#: ``sign``), made by :func:`warm` and inherited through fork like the sessions.
_PRESIGNERS: dict[tuple, Any] = {}
#: Query parameters that depend on the moment of signing.
_MOMENT_PARAMS = frozenset({"X-Amz-Date", "X-Amz-Signature", "Signature", "Expires"})


def _options_key(fs) -> tuple:
    return (type(fs).__qualname__, repr(sorted((getattr(fs, "storage_options", None) or {}).items())))


def warm(fs) -> None:
    """Set up ``fs``'s botocore session now and remember it for forked workers (no request)."""
    if direct_getter(fs) is None:
        return
    _adopt_session(fs)
    if getattr(fs, "session", None) is None:
        fs.connect()
    key = _options_key(fs)
    _SESSIONS[key] = fs.session
    if key not in _PRESIGNERS:
        _PRESIGNERS[key] = _make_presigner(fs)


def _make_presigner(fs):
    """A synchronous botocore S3 client that presigns exactly as ``fs.sign`` does, or None.

    Only for explicit static credentials (``key`` and ``secret`` in the options, no profile):
    anything the credential chain resolves or refreshes keeps s3fs's signer. The client is
    built from the options s3fs builds its own from, and kept only if a probe URL signed both
    ways is the same apart from the moment of signing.
    """
    if getattr(fs, "anon", False) or not (fs.key and fs.secret) or fs.kwargs or getattr(fs, "cache_regions", False):
        return None
    try:
        import botocore.session
        from botocore.config import Config

        session = botocore.session.Session()
        if getattr(fs, "session", None) is not None:  # its parsed service models
            session.register_component("data_loader", fs.session.get_component("data_loader"))
        init = {"aws_access_key_id": fs.key, "aws_secret_access_key": fs.secret, "aws_session_token": fs.token,
                "endpoint_url": fs.endpoint_url, "use_ssl": fs.use_ssl}
        kwargs = {**(fs.client_kwargs or {}), **{k: v for k, v in init.items() if v is not None}}
        client = session.create_client("s3", config=Config(**(fs.config_kwargs or {})), **kwargs)
        probe = "trainhub-presign-probe/probe.tar"
        same = _moment_free(_presign(client, fs, probe)) == _moment_free(fs.sign(probe, expiration=URL_EXPIRES))
    except Exception as e:  # an option the synchronous client does not take: s3fs signs
        log.debug("no synchronous presigner for %s: %s", _endpoint(fs), e)
        return None
    if not same:
        log.debug("synchronous presigner for %s signs differently from s3fs; s3fs signs", _endpoint(fs))
        return None
    return client


def _presign(client, fs, path: str) -> str:
    bucket, key, version = fs.split_path(path)
    params = {"Bucket": bucket, "Key": key, **({"VersionId": version} if version else {})}
    return client.generate_presigned_url("get_object", Params=params, ExpiresIn=URL_EXPIRES)


def _moment_free(url: str) -> tuple:
    parts = urllib.parse.urlsplit(url)
    query = sorted((k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
                   if k not in _MOMENT_PARAMS)
    return parts.scheme, parts.netloc, parts.path, query


def _adopt_session(fs) -> None:
    """Give a new filesystem the session a previous one with the same options set up."""
    if getattr(fs, "session", None) is None and getattr(fs, "_s3", None) is None:
        session = _SESSIONS.get(_options_key(fs))
        if session is not None:
            fs.session = session


def direct_getter(fs) -> "DirectGetter | None":
    """A :class:`DirectGetter` for ``fs``, or ``None`` when s3fs's own client must be used."""
    try:
        import s3fs
    except ImportError:  # pragma: no cover - s3fs is a dependency
        return None
    if not isinstance(fs, s3fs.S3FileSystem):
        return None
    if getattr(fs, "req_kw", None):  # RequestPayer, SSE-C keys...: headers a presigned GET would not carry
        return None
    if (getattr(fs, "config_kwargs", None) or {}).get("proxies") or _proxied(_endpoint(fs)):
        return None
    return DirectGetter(fs)


def _endpoint(fs) -> str:
    return (getattr(fs, "endpoint_url", None) or (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
            or "https://s3.amazonaws.com")


def _proxied(url: str) -> bool:
    """Whether an HTTP(S) proxy from the environment applies to ``url``."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(parts.hostname or "")


class DirectGetter:
    """Fetch objects of one s3fs filesystem with presigned ``http.client`` GETs.

    ``get(path, size=None) -> bytearray``. Raises ``FileNotFoundError`` (404),
    ``PermissionError`` (403) or ``OSError`` (anything else, after ``ATTEMPTS`` tries for
    transient failures) with S3's own message. Safe to call from several threads.
    """

    def __init__(self, fs, part_size: int | None = None, max_parts: int | None = None):
        _adopt_session(fs)
        self.fs = fs
        self.part_size = int(part_size or PART_SIZE)
        self.max_parts = int(max_parts or MAX_PARTS_IN_FLIGHT)
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None
        self._presigner = _PRESIGNERS.get(_options_key(fs))

    # -- public ------------------------------------------------------------------------

    def sign(self, path: str) -> str:
        if self._presigner is not None:
            return _presign(self._presigner, self.fs, path)
        return self.fs.sign(path, expiration=URL_EXPIRES)

    def get(self, path: str, size: int | None = None, into: bytearray | None = None) -> bytearray | memoryview:
        """The object's bytes. With its ``size`` known, ``into`` (a reusable buffer of at least
        ``size`` bytes) receives them and the returned memoryview covers its first ``size``
        bytes: a reader recycling its shard buffers spares the kernel a page fault per 4 KiB."""
        url = self.sign(path)
        if size is None:
            return self._get_whole(url, path, None, None)
        if into is None:
            into = bytearray(size)
        elif len(into) < size:
            raise ValueError(f"buffer of {len(into)} bytes for {size}")
        view = memoryview(into)[:size]
        if size <= self.part_size:
            self._get_whole(url, path, size, view)
            return into if len(into) == size else view
        ranges = [(start, min(start + self.part_size, size)) for start in range(0, size, self.part_size)]
        # This thread reads the first range itself; the others go to the shared part pool.
        futures = [self._part_pool().submit(self._get_range, url, path, view[a:b], a, b, size) for a, b in ranges[1:]]
        try:
            a, b = ranges[0]
            self._get_range(url, path, view[a:b], a, b, size)
            for f in futures:
                f.result()
        finally:
            for f in futures:
                f.cancel()
        return into if len(into) == size else view

    def close(self) -> None:
        """End the range pool and the calling thread's connections (other threads' close
        with their sockets)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
        for conn in (getattr(self._local, "conns", None) or {}).values():
            conn.close()
        self._local.conns = {}

    # -- requests ----------------------------------------------------------------------

    def _part_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_parts, thread_name_prefix="trainhub-range")
            return self._pool

    def _get_whole(self, url: str, path: str, size: int | None, view: memoryview | None) -> bytearray | None:
        """One GET of the whole object: into ``view`` (``size`` bytes) or a new bytearray."""
        def once():
            resp = self._request(url, path, {})
            length = resp.getheader("Content-Length")
            if size is not None:
                if length is None or int(length) != size:
                    resp.close()
                    raise self._size_error(path, size, length)
                self._read_into(resp, view, path)
                return None
            if length is None:
                return bytearray(resp.read())
            body = bytearray(int(length))
            self._read_into(resp, memoryview(body), path)
            return body
        return self._attempts(once, path)

    def _get_range(self, url: str, path: str, view: memoryview, start: int, stop: int, size: int) -> None:
        def once():
            resp = self._request(url, path, {"Range": f"bytes={start}-{stop - 1}"})
            total = _content_range_total(resp.getheader("Content-Range"))
            if resp.status != 206 or total != size:
                resp.close()
                raise self._size_error(path, size, total if total is not None else resp.getheader("Content-Length"))
            self._read_into(resp, view, path)
        self._attempts(once, path)

    def _attempts(self, once, path: str):
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return once()
            except _Retry as e:
                self._drop_connection()
                if attempt == ATTEMPTS:
                    raise OSError(f"GET {self.fs.unstrip_protocol(path)} failed {ATTEMPTS} times: {e}") from None
                log.debug("GET %s: %s; retrying", path, e)
                time.sleep(0.1 * 2 ** attempt)
            except BaseException:
                self._drop_connection()
                raise

    def _request(self, url: str, path: str, headers: dict) -> http.client.HTTPResponse:
        parts = urllib.parse.urlsplit(url)
        target = parts.path + ("?" + parts.query if parts.query else "")
        conn, reused = self._connection(parts)
        try:
            conn.request("GET", target, headers=headers)
            resp = conn.getresponse()
        except (ConnectionError, http.client.HTTPException, socket.timeout, OSError) as e:
            if isinstance(e, ssl.SSLCertVerificationError):
                raise
            raise _Retry(f"{type(e).__name__}: {e}" + (" (reused connection)" if reused else "")) from None
        if resp.status in (200, 206):
            return resp
        body = resp.read()
        message = _S3_MESSAGE.search(body)
        reason = (message.group(1).decode("utf-8", "replace") if message else body[:200].decode("utf-8", "replace")) \
            or resp.reason
        where = self.fs.unstrip_protocol(path)
        if resp.status in _RETRY_STATUS:
            raise _Retry(f"HTTP {resp.status}: {reason}")
        if resp.status == 404:
            raise FileNotFoundError(f"{where}: {reason}")
        if resp.status == 403:
            raise PermissionError(f"{where}: access denied ({reason})")
        raise OSError(f"GET {where} failed: HTTP {resp.status} {reason}")

    def _read_into(self, resp: http.client.HTTPResponse, view: memoryview, path: str) -> None:
        pos, end = 0, len(view)
        try:
            while pos < end:
                n = resp.readinto(view[pos:])
                if not n:
                    break
                pos += n
        except (ConnectionError, http.client.HTTPException, socket.timeout, OSError) as e:
            raise _Retry(f"{type(e).__name__} after {pos} of {end} bytes: {e}") from None
        if pos < end:
            raise _Retry(f"connection closed after {pos} of {end} bytes")

    def _size_error(self, path: str, expected: int, got: Any) -> CorruptShardError:
        return CorruptShardError(
            f"{self.fs.unstrip_protocol(path)} has {got} bytes but the shard index records {expected}: "
            "the folder changed after it was packed; pack it again")

    # -- connections: one per thread and host, kept alive when the server allows it ----
    # (when a response says it closes, http.client drops the socket and the next request
    # here opens a new one).

    def _connection(self, parts: urllib.parse.SplitResult) -> tuple[http.client.HTTPConnection, bool]:
        key = (parts.scheme, parts.hostname, parts.port)
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        self._local.last = key
        conn = conns.get(key)
        if conn is not None and conn.sock is not None:
            return conn, True
        if parts.scheme == "https":
            conn = _HTTPSConnection(parts.hostname, parts.port, timeout=TIMEOUT, context=self._ssl_context())
        else:
            conn = _HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT)
        conns[key] = conn
        return conn, False

    def _drop_connection(self) -> None:
        conn = (getattr(self._local, "conns", None) or {}).pop(getattr(self._local, "last", None), None)
        if conn is not None:
            conn.close()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            verify = (getattr(self.fs, "client_kwargs", None) or {}).get("verify", True)
            if verify is False:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            else:
                cafile = verify if isinstance(verify, str) else os.environ.get("AWS_CA_BUNDLE") or None
                ctx = ssl.create_default_context(cafile=cafile)
            self._ssl = ctx
        return self._ssl


def _receive_buffer(rmem_max: str = "/proc/sys/net/core/rmem_max") -> int:
    """``RECV_BUFFER`` where ``net.core.rmem_max`` allows it, else 0 (leave autotuning on)."""
    try:
        with open(rmem_max) as f:
            cap = int(f.read())
    except (OSError, ValueError):
        return 0
    return RECV_BUFFER if cap >= RECV_BUFFER else 0


_RECEIVE_BUFFER = _receive_buffer()


def _tune(sock) -> None:
    if _RECEIVE_BUFFER:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RECEIVE_BUFFER)


class _HTTPConnection(http.client.HTTPConnection):
    def connect(self):
        super().connect()
        _tune(self.sock)


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self):
        super().connect()
        _tune(self.sock)


def _content_range_total(value: str | None) -> int | None:
    """``"bytes 0-99/1234" -> 1234``."""
    if not value or "/" not in value:
        return None
    total = value.rsplit("/", 1)[1].strip()
    return int(total) if total.isdigit() else None
