"""REST handlers of the jobs API (see openapi.json beside this file)."""

from __future__ import annotations

import asyncio
import heapq
from pathlib import Path

from tornado import iostream, web

from trainhub.exceptions import InvalidRequest, NotFound, TooLarge
from trainhub.httpapi import parse_id
from trainhub.states import JOB_STATES, JOB_TERMINAL, QUEUED
from trainhub.workdir import size_text

from trainhub.services.api import APIHandler

from .models import KINDS, parse_job_key
from .spec import validate_spec
from .store import job_to_dict
from .worker import MAX_LOG_LINE

READ, WRITE = "custom:trainhub:jobs:read", "custom:trainhub:jobs:write"
JOB_ID = r"(j-\d+|\d+)"


class JobAccessMixin:
    async def load_job(self, key: str, write: bool = False):
        job_id = parse_job_key(key)
        if job_id is None:
            raise NotFound(f"no job {key!r}")
        try:
            job = await self.service.store.lookup(self.service.store.record, job_id)
        except NotFound:
            raise NotFound(f"job {key} not found") from None
        caller = self.caller
        if not caller.may(READ, job.user):
            raise NotFound(f"job {key} not found")  # not revealed
        if write and not caller.may(WRITE, job.user):
            raise web.HTTPError(403, f"you may read job {key} but not change it")
        return job

    def job_json(self, job) -> dict:
        body = job_to_dict(job, self.service.api_prefix.rstrip("/"))
        if job.state == QUEUED:  # a waiting job's reason is the scheduler's latest, worked out on demand
            why = self.service.engine.why(job.id)
            if why is not None:
                body["reason"] = why.message
        return body


class RootHandler(APIHandler):
    async def get(self):
        self.caller
        limits = self.service.workdirs.limits
        self.write_json({"service": "trainhub", "version": self.service.version,
                         "links": {"jobs": f"{self.service.api_prefix}jobs", "openapi": f"{self.service.api_prefix}openapi.json"},
                         "limits": {"workdir_bytes": limits.max_bytes, "workdir_files": limits.max_files}})


class StallsHandler(APIHandler):
    """What held up the service's event loop since it started (trainhub.loopwatch): admins only, since it shows
    where the service's code was, not anyone's jobs."""

    async def get(self):
        if not self.caller.admin:
            raise web.HTTPError(403, "only admins may read the service's stall counts")
        watch = self.service.loopwatch
        if watch is None:
            raise NotFound("the service runs without its loop watch (JobsService.stall_log_threshold = 0)")
        self.write_json(watch.snapshot())


class OpenAPIHandler(APIHandler):
    async def get(self):
        self.set_header("Content-Type", "application/json")
        self.finish(self.service.openapi_text)


class JobsHandler(JobAccessMixin, APIHandler):
    async def get(self):
        states = self.states_arg(JOB_STATES, "states")
        limit, offset = self.page()
        who = self.listing_owner(READ, "jobs")
        sweep = self.get_argument("sweep", None)
        sweep_id = parse_id(sweep) if sweep is not None else None
        if sweep is not None and sweep_id is None:
            raise InvalidRequest(f"sweep must be a sweep's number, not {sweep[:40]!r}")
        kind = self.get_argument("kind", None)
        if kind is not None and kind not in KINDS:
            raise InvalidRequest(f"unknown kind {kind[:40]!r}; kinds are {list(KINDS)}")
        before = self.get_argument("before", None)
        before_id = parse_job_key(before) if before is not None else None
        if before is not None and before_id is None:
            raise InvalidRequest(f"before must be a job id such as j-000123 (the next_before of a page), not {before[:40]!r}")
        items, total = await self.service.store.lookup(self.service.store.list, who, states or None, limit, offset, sweep_id,
                                                       kind, before_id)
        # a full page may have more after it: the cursor of the next (its older jobs), cheaper than a growing offset
        after = items[-1].key if len(items) == limit else None
        self.write_json({"items": [self.job_json(j) for j in items], "total": total, "limit": limit, "offset": offset,
                         "next_before": after})

    async def post(self):
        caller = self.caller
        if not caller.may(WRITE, caller.name):
            raise web.HTTPError(403, f"missing scope {WRITE} to submit jobs")
        body = self.json_body()
        spec = validate_spec(body)
        if spec.profile:  # an unknown one in the catalog's words, before the document's enum
            self.service.catalog.get(spec.profile)
        self.check_body(body, "JobSpec")
        job = await self.service.submit(caller, spec)
        self.write_json(self.job_json(job), status=201)


class JobHandler(JobAccessMixin, APIHandler):
    async def get(self, key):
        job = await self.load_job(key)
        self.write_json(self.job_json(job))

    async def delete(self, key):
        job = await self.load_job(key, write=True)
        job = await self.service.store.write(self.service.store.request_cancel, job.id, self.caller.name)
        self.service.engine.wake()
        self.write_json(self.job_json(job), status=202)


class JobEventsHandler(JobAccessMixin, APIHandler):
    async def get(self, key):
        job = await self.load_job(key)
        self.write_json({"items": await self.service.store.read(self.service.store.events, job.id)})


class JobWhyHandler(JobAccessMixin, APIHandler):
    async def get(self, key):
        job = await self.load_job(key)
        why = self.service.engine.why(job.id) if job.state == QUEUED else None
        body = {"id": job.key, "state": job.state, "reason": job.reason}
        if why is not None:
            body.update(reason=why.message, code=why.code, message=why.message, blocking_job=(f"j-{int(why.blocking_job):06d}" if why.blocking_job and str(why.blocking_job).isdigit() else why.blocking_job),
                        reserved_start=why.reserved_start, estimated_start=why.estimated_start)
        self.write_json(body)


class JobMetricsHandler(JobAccessMixin, APIHandler):
    async def get(self, key):
        job = await self.load_job(key)
        self.write_json(await self.service.store.read(self.service.store.metrics, job.id))


class WorkdirHandler(APIHandler):
    """``/workdirs/{sha256}``: a working directory sent with jobs (trainhub.workdir), the caller's own.

    GET: is it stored (what it holds), or 404. PUT: store it; the body (the ``.tar.gz``, ``application/octet-stream``) is streamed to a file
    piece by piece as it arrives (services/jobs/workdirs.py), never held whole, and past the limits dropped and refused
    (413); it must hash to its name and pass the unpacking's checks (400 naming what is wrong)."""

    _upload = None
    _too_big = False

    async def prepare(self):
        put = self.request.method == "PUT"
        if put:  # a body up to an archive's bound is read (the JSON routes' bound is the service's)
            self.request.connection.set_max_body_size(self.service.workdirs.limits.archive_bytes + (1 << 20))
        await super().prepare()
        if not put or self._refusal is not None:
            return
        try:
            caller = self.caller
            if not caller.may(WRITE, caller.name):
                raise web.HTTPError(403, f"missing scope {WRITE} to send working directories with jobs")
            length = self.request.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > self.service.workdirs.limits.archive_bytes:
                self._too_big = True  # read and dropped as it arrives; answered once it has
                return
            self._upload = await asyncio.to_thread(self.service.workdirs.receive, caller.name, self.path_kwargs["sha256"])
        except Exception as e:
            self._refusal = e

    async def data_received(self, chunk: bytes):
        if self._upload is not None:  # on a worker thread: each piece is a file write
            await asyncio.to_thread(self._upload.write, chunk)

    def on_finish(self):
        if self._upload is not None:
            self._upload.discard()  # whatever did not make it into place (a refusal, an interruption)

    def on_connection_close(self):
        super().on_connection_close()
        self.on_finish()

    async def get(self, sha256):
        caller = self.caller
        if not caller.may(READ, caller.name):
            raise web.HTTPError(403, f"missing scope {READ}")
        info = await asyncio.to_thread(self.service.workdirs.info, caller.name, sha256)
        if info is None:
            raise NotFound(f"no working directory {sha256} stored for {caller.name}: send it with PUT")
        self.write_json(info.to_dict())

    async def put(self, sha256):
        caller = self.caller
        store = self.service.workdirs
        if self._too_big:
            raise TooLarge(f"the working directory archive is {self.request.headers.get('Content-Length')} bytes; at most "
                           f"{store.limits.archive_bytes:,} are taken (files up to {size_text(store.limits.max_bytes)}, "
                           f"{store.limits.max_files:,} entries): leave out what the job does not need "
                           "(.trainhubignore, --exclude)")
        existed = await asyncio.to_thread(store.exists, caller.name, sha256)
        info = await asyncio.to_thread(self._upload.finish)
        keep = await self.service.workdirs_in_use(caller.name)
        await asyncio.to_thread(store.prune, caller.name, keep | {sha256})
        self.write_json(info.to_dict(), status=200 if existed else 201)


def log_files(job_dir: str, worker: int | None) -> list[Path]:
    root = Path(job_dir)
    files = []
    for adir in sorted(root.glob("attempt-*"), key=lambda p: int(p.name.split("-")[1])):
        for f in sorted(adir.glob("worker-*.log"), key=lambda p: int(p.stem.split("-")[1])):
            if worker is None or int(f.stem.split("-")[1]) == worker:
                files.append(f)
    return files


LOG_CHUNK = 1 << 20  # bytes of log read per pass: a log of any size is streamed, never held whole
MAX_TAIL_LINES = 100_000
FOLLOW_CHUNK = 64 << 10  # bytes a follow reads per wake on the event loop
FOLLOW_CHECK = 2.0  # seconds: a follow looks at its job's state at least this often (new lines and the end wake it)


def read_new(files: list[Path], offsets: dict, budget: int = LOG_CHUNK) -> list[bytes]:
    """New complete lines of each file since ``offsets`` (at most ``budget`` bytes in all, shared
    between the files, but never less than the longest line of a worker's log per file: the wrapper cuts longer
    lines into pieces, worker.LINE_CAP), merged in time order. A longer line (written by other means) is passed on
    in pieces."""
    per_file = []
    share = max(budget // max(len(files), 1), MAX_LOG_LINE)
    for f in files:
        start = offsets.get(f, 0)
        try:
            with open(f, "rb") as fh:
                fh.seek(start)
                data = fh.read(share)
        except FileNotFoundError:
            continue
        end = data.rfind(b"\n") + 1
        if not end and len(data) == share:  # one line longer than the share: its piece, so reading moves on
            offsets[f] = start + share
            per_file.append([data + b"\n"])
        elif end:
            offsets[f] = start + end
            per_file.append(data[:end].splitlines(keepends=True))
    return list(heapq.merge(*per_file, key=lambda line: line[:24]))


def unread_bytes(files: list[Path], offsets: dict) -> int:
    """Bytes of ``files`` past ``offsets`` (a missing file has none)."""
    total = 0
    for f in files:
        try:
            total += max(0, f.stat().st_size - offsets.get(f, 0))
        except FileNotFoundError:
            pass
    return total


def tail_lines(files: list[Path], n: int, offsets: dict, budget: int = 8 * LOG_CHUNK) -> list[bytes]:
    """The last ``n`` complete lines (from at most ``budget`` bytes at the end of the files); ``offsets``
    are left at each file's end, so a follow carries on from there."""
    per_file = []
    share = max(budget // max(len(files), 1), MAX_LOG_LINE)
    for f in files:
        try:
            with open(f, "rb") as fh:
                size = fh.seek(0, 2)
                start = max(0, size - share)
                fh.seek(start)
                data = fh.read(size - start)
        except FileNotFoundError:
            continue
        end = data.rfind(b"\n") + 1
        offsets[f] = start + end
        lines = data[:end].splitlines(keepends=True)
        per_file.append(lines[1:] if start and lines else lines)  # the first may be a piece of a line
    return list(heapq.merge(*per_file, key=lambda line: line[:24]))[-n:] if n else []


class JobLogsHandler(JobAccessMixin, APIHandler):
    _follower = None
    _gone = False  # the client went away: a follow ends at once, not when its job next prints or ends

    def on_connection_close(self):
        self._gone = True
        if self._follower is not None:
            self._follower.event.set()

    async def get(self, key):
        job = await self.load_job(key)
        worker = self.get_argument("worker", None)
        if worker is not None and not (worker.isdigit() and len(worker) <= 6):
            raise InvalidRequest("worker must be a worker rank (0, 1, ...)")
        worker = int(worker) if worker is not None else None
        tail = self.get_argument("tail", None)
        if tail is not None and not (tail.isdigit() and int(tail) <= MAX_TAIL_LINES):
            raise InvalidRequest(f"tail must be a number of lines, at most {MAX_TAIL_LINES}")
        follow = self.get_argument("follow", "false").lower()
        if follow not in ("1", "true", "yes", "0", "false", "no"):
            raise InvalidRequest("follow must be true or false")
        follow = follow in ("1", "true", "yes")
        job_dir = self.service.launcher.job_dir(self.service.engine_view(job))
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        if follow:
            self.set_header("X-Accel-Buffering", "no")
            # each line goes out as it is written: without TCP_NODELAY a small write after the headers waits for
            # the proxy's delayed acknowledgement (Nagle's algorithm), tens of milliseconds per line
            stream = getattr(self.request.connection, "stream", None)
            if stream is not None:
                stream.set_nodelay(True)
        offsets: dict = {}
        try:
            if tail is not None:
                lines = await self._on_files(lambda files: tail_lines(files, int(tail), offsets), job_dir, worker,
                                             offsets)
                self.write(b"".join(lines))
            else:
                while chunk := await self._on_files(lambda files: read_new(files, offsets), job_dir, worker, offsets):
                    self.write(b"".join(chunk))
                    await self.flush()
            if not follow:
                return self.finish()
            await self.flush()
            with self.service.logwatch.follow(job_dir) as self._follower:
                ended = False  # seen in a final state: one more read takes what its workers wrote last
                while not self._gone:
                    # on the loop, a small share at a time: a wake's few new lines of a local file cost less than the
                    # trip to a worker thread, which on a loaded machine is a wait between the line and its reader
                    new = read_new(log_files(job_dir, worker), offsets, FOLLOW_CHUNK)
                    if new:
                        self.write(b"".join(new))
                        await self.flush()
                        continue
                    if ended:
                        break
                    current = await self.service.store.lookup(self.service.store.record, job.id)
                    if current.state in JOB_TERMINAL:
                        ended = True
                        continue
                    await self._follower.changed(FOLLOW_CHECK)
        except iostream.StreamClosedError:
            return
        if not self._gone:
            self.finish()

    @staticmethod
    async def _on_files(read, job_dir: str, worker: int | None, offsets: dict):
        """``read(files)`` of the job's log files: on the loop when at most ``FOLLOW_CHUNK`` bytes of them are unread
        past ``offsets`` (a job just submitted or started: the follow a notebook's panel opens then), else on a worker
        thread. The trip to a thread costs more than a few KiB, and while a job starts it is a wait for the GIL beside
        the start itself."""
        files = log_files(job_dir, worker)
        if unread_bytes(files, offsets) <= FOLLOW_CHUNK:
            return read(files)
        return await asyncio.to_thread(read, files)


def default_handlers(prefix: str, service) -> list:
    api = prefix.rstrip("/") + "/api"
    kw = {"service": service}
    return [
        (api + r"/?", RootHandler, kw),
        (api + r"/openapi.json", OpenAPIHandler, kw),
        (api + r"/service/stalls", StallsHandler, kw),
        (api + r"/jobs/?", JobsHandler, kw),
        (api + rf"/jobs/{JOB_ID}/?", JobHandler, kw),
        (api + rf"/jobs/{JOB_ID}/logs", JobLogsHandler, kw),
        (api + rf"/jobs/{JOB_ID}/metrics", JobMetricsHandler, kw),
        (api + rf"/jobs/{JOB_ID}/events", JobEventsHandler, kw),
        (api + rf"/jobs/{JOB_ID}/why", JobWhyHandler, kw),
        (api + r"/workdirs/(?P<sha256>[0-9a-f]{64})", WorkdirHandler, kw),
    ]
