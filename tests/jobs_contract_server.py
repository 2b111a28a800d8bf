"""An in-process stand-in for the trainhub jobs service, implementing docs/jobs-api.md's shapes.

CONTRACT TEST DOUBLE, not the real service: it checks that the client side (TrainhubClient, the
`trainhub jobs` CLI, the %%train magic) speaks the documented contract. Jobs really run, as local
subprocesses (``python script.py`` or ``bash -c command``) with the documented environment
(TRAINHUB_JOB_ID, TRAINHUB_OUTPUTS_DIR, TRAINHUB_METRICS_FILE...), so generated job scripts are
executed for real. No scheduling, GPUs, quotas beyond a fixed per-user GPU limit, or retries.
The lead's end-to-end tests run the real service through `trainhub up`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path

import tornado.httpserver
import tornado.netutil
import tornado.web

from trainhub.states import JOB_TERMINAL as TERMINAL

TOKEN = "contract-token"
USER = "alice"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class FakeJobsService:
    """State of the fake service; tests read ``posts`` and ``jobs`` and set ``fail_gets``/``fail_posts``."""

    def __init__(self, root: Path, quota_gpus: int = 4, pool_gpus: int = 8, profiles=None):
        self.root = root
        self.quota_gpus = quota_gpus
        self.pool_gpus = pool_gpus
        self.profiles = profiles or {"cpu": 0, "gpu-1": 1, "gpu-2": 2}
        self.lock = threading.Lock()
        self.counter = 0  # job ids stay unique across resets (job dirs are kept)
        self.reset()

    def reset(self):
        for j in getattr(self, "procs", {}).values():
            if j.poll() is None:
                j.kill()
        self.jobs: dict[str, dict] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.workdirs: dict[str, bytes] = {}  # sha256 -> archive (PUT /workdirs/{sha256})
        self.workdir_puts = 0
        self.posts = 0  # POST /jobs received (accepted or not)
        self.fail_gets = 0  # answer the next N GETs with 503 (proxy without service)
        self.fail_posts = 0  # the same for POSTs (after counting them in ``posts``)

    # -- jobs -----------------------------------------------------------------------------------
    def submit(self, spec: dict) -> tuple[int, dict]:
        allowed = {"name", "command", "script", "gpus", "workers", "env", "time_limit", "retries", "profile",
                   "priority", "preemptible", "workdir"}
        unknown = set(spec) - allowed
        if unknown:
            return 400, {"status": 400, "message": f"unknown field(s): {', '.join(sorted(unknown))}"}
        if bool(spec.get("command")) == bool(spec.get("script")):
            return 400, {"status": 400, "message": "give exactly one of 'command' or 'script'"}
        profile = spec.get("profile")
        if profile is not None and profile not in self.profiles:
            return 400, {"status": 400, "message": f"profile: unknown profile {profile!r} (one of {', '.join(self.profiles)})"}
        gpus = spec.get("gpus", self.profiles.get(profile, 0) if profile else 0)
        workers = spec.get("workers", 1)
        if not isinstance(gpus, int) or gpus < 0:
            return 400, {"status": 400, "message": "gpus: must be an integer >= 0"}
        if not isinstance(workers, int) or workers < 1:
            return 400, {"status": 400, "message": "workers: must be an integer >= 1"}
        total = gpus * workers
        if total > self.pool_gpus:
            return 400, {"status": 400, "message": f"the job needs {total} GPUs but the whole pool has {self.pool_gpus}"}
        if total > self.quota_gpus:
            return 403, {"status": 403, "message": f"the job needs {total} GPUs but your quota is {self.quota_gpus} GPUs"}
        workdir = spec.get("workdir")
        if workdir is not None and workdir not in self.workdirs:
            return 404, {"status": 404, "message": f"no working directory {workdir} is stored: PUT /workdirs/{workdir} first"}
        with self.lock:
            self.counter += 1
            job_id = f"j-{self.counter:06d}"
        jdir = self.root / job_id
        (jdir / "outputs").mkdir(parents=True)
        cwd = jdir
        if workdir is not None:  # unpacked as the documented contract says: the job's cwd is the copy
            import io

            from trainhub import workdir as wd

            with wd.DirSink(jdir / "workdir") as sink:
                wd.unpack(io.BytesIO(self.workdirs[workdir]), sink)
            cwd = jdir / "workdir"
        job = {"id": job_id, "name": spec.get("name") or job_id, "user": USER, "state": "running", "reason": "",
               "gpus": gpus, "workers": workers, "devices": [list(range(w * gpus, (w + 1) * gpus)) for w in range(workers)],
               "profile": profile, "command": spec.get("command") or "python script.py", "script": spec.get("script"),
               "env": spec.get("env") or {}, "time_limit": spec.get("time_limit"), "retries": spec.get("retries", 0),
               "attempt": 1, "exit_codes": [], "created": now_iso(), "started": now_iso(), "finished": None,
               "outputs_url": f"file://{jdir}", "outputs_path": str(jdir / "outputs"),
               "links": {"self": f"/jobs/{job_id}", "logs": f"/jobs/{job_id}/logs", "metrics": f"/jobs/{job_id}/metrics"}}
        env = dict(os.environ, **job["env"], TRAINHUB_JOB_ID=job_id, TRAINHUB_JOB_DIR=str(jdir),
                   TRAINHUB_OUTPUTS_DIR=str(jdir / "outputs"), TRAINHUB_METRICS_FILE=str(jdir / "metrics.jsonl"),
                   TRAINHUB_PARAMS="{}", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   TRAINHUB_JOB_URL=f"file://{jdir}", TRAINHUB_JOB_ATTEMPT="1", TRAINHUB_STORAGE_OPTIONS="{}",
                   PYTHONUNBUFFERED="1")
        env.pop("TRAINHUB_API_URL", None)
        if spec.get("script"):
            (jdir / "script.py").write_text(spec["script"])
            argv = [sys.executable, str(jdir / "script.py")]
        else:
            argv = ["bash", "-c", spec["command"]]
        log = open(jdir / "output.log", "wb")
        self.procs[job_id] = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True)
        log.close()
        self.jobs[job_id] = job
        return 201, job

    def workdir_info(self, sha: str) -> dict:
        import io

        from trainhub import workdir as wd

        got = wd.check_archive(io.BytesIO(self.workdirs[sha]))
        return {"sha256": sha, "size": len(self.workdirs[sha]), "files": got.files, "bytes": got.bytes,
                "entries": got.entries}

    def poll(self, job_id: str) -> dict:
        job = self.jobs[job_id]
        proc = self.procs[job_id]
        if job["state"] == "running" and proc.poll() is not None:
            code = proc.returncode
            job.update(exit_codes=[code], finished=now_iso(),
                       state="succeeded" if code == 0 else "failed",
                       reason="all workers exited 0" if code == 0 else f"worker 0 exited with code {code}")
        return job

    def cancel(self, job_id: str) -> dict:
        job = self.poll(job_id)
        if job["state"] not in TERMINAL:
            proc = self.procs[job_id]
            proc.terminate()
            proc.wait(5)
            job.update(state="cancelled", reason=f"cancelled by {USER}", finished=now_iso(),
                       exit_codes=[proc.returncode])
        return job

    def log_lines(self, job_id: str) -> list[str]:
        path = self.root / job_id / "output.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        stamp = self.jobs[job_id]["started"]
        return [f"{stamp} [0] {ln}" for ln in text.splitlines()]

    def metrics(self, job_id: str) -> dict:
        path = self.root / job_id / "metrics.jsonl"
        recs = []
        if path.exists():
            for ln in path.read_text().splitlines():
                r = json.loads(ln)
                recs.append({"time": datetime.fromtimestamp(r["time"], timezone.utc).isoformat(), "step": r["step"],
                             "worker": 0, "values": r["values"]})
        gpu = [{"time": now_iso(), "worker": 0, "device": 0, "utilization": 37.0, "memory_used_mb": 900, "simulated": True}]
        return {"metrics": recs, "gpu": gpu, "total": {"metrics": len(recs), "gpu": len(gpu)}}


class Base(tornado.web.RequestHandler):
    def initialize(self, svc):
        self.svc = svc

    def prepare(self):
        auth = self.request.headers.get("Authorization", "")
        if auth != f"token {TOKEN}":
            self.fail(403 if auth else 401, "missing or invalid token")
        if self.request.method == "POST":
            self.svc.posts += 1
        attr = {"GET": "fail_gets", "POST": "fail_posts"}.get(self.request.method)
        if attr and getattr(self.svc, attr) > 0:
            setattr(self.svc, attr, getattr(self.svc, attr) - 1)
            self.set_status(503)
            self.finish("<html>503: service unavailable</html>")

    def fail(self, status, message):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status, "message": message}))

    def send(self, obj, status=200):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def job_or_404(self, job_id):
        if job_id not in self.svc.jobs:
            self.fail(404, f"no job {job_id}")
            return None
        return self.svc.poll(job_id)


class JobsHandler(Base):
    def post(self):
        try:
            spec = json.loads(self.request.body or b"{}")
        except ValueError:
            return self.fail(400, "the body is not JSON")
        status, body = self.svc.submit(spec)
        self.send(body, status)

    def get(self):
        states = [s for arg in self.get_arguments("state") for s in arg.split(",") if s]
        limit = int(self.get_argument("limit", "50"))
        offset = int(self.get_argument("offset", "0"))
        user = self.get_argument("user", None)
        items = [self.svc.poll(j) for j in sorted(self.svc.jobs, reverse=True)]
        items = [j for j in items if (not states or j["state"] in states) and (not user or j["user"] == user)]
        self.send({"items": items[offset:offset + limit], "total": len(items), "limit": limit, "offset": offset})


class JobHandler(Base):
    def get(self, job_id):
        job = self.job_or_404(job_id)
        if job is not None:
            self.send(job)

    def delete(self, job_id):
        if self.job_or_404(job_id) is not None:
            self.send(self.svc.cancel(job_id), 202)


class LogsHandler(Base):
    async def get(self, job_id):
        if self.job_or_404(job_id) is None:
            return
        tail = self.get_argument("tail", None)
        worker = self.get_argument("worker", None)
        self.set_header("Content-Type", "text/plain; charset=utf-8")

        def select(lines):
            if worker is not None:
                lines = [ln for ln in lines if re.search(rf" \[{int(worker)}\] ", ln)]
            return lines

        everything = select(self.svc.log_lines(job_id))
        lines = everything
        if tail is not None:
            lines = lines[-int(tail):] if int(tail) else []
        if not self.get_argument("follow", None):
            return self.finish("".join(ln + "\n" for ln in lines))
        sent = len(everything)  # one read: a line written between two reads was neither sent nor followed
        for ln in lines:
            self.write(ln + "\n")
        await self.flush()
        while True:
            done = self.svc.poll(job_id)["state"] in TERMINAL
            now = select(self.svc.log_lines(job_id))
            for ln in now[sent:]:
                self.write(ln + "\n")
            sent = len(now)
            await self.flush()
            if done:
                break
            await asyncio.sleep(0.05)
        self.finish()


class MetricsHandler(Base):
    def get(self, job_id):
        if self.job_or_404(job_id) is not None:
            self.send(self.svc.metrics(job_id))


class WorkdirHandler(Base):
    def get(self, sha):
        if sha not in self.svc.workdirs:
            return self.fail(404, f"no working directory {sha}")
        self.send(self.svc.workdir_info(sha))

    def put(self, sha):
        import hashlib

        body = self.request.body
        self.svc.workdir_puts += 1
        if hashlib.sha256(body).hexdigest() != sha:
            return self.fail(400, "the archive does not hash to its name")
        existed = sha in self.svc.workdirs
        self.svc.workdirs[sha] = body
        self.send(self.svc.workdir_info(sha), 200 if existed else 201)


class RootHandler(Base):
    def get(self):
        self.send({"service": "trainhub", "version": "contract", "links": {},
                   "limits": {"workdir_bytes": 50 << 20, "workdir_files": 10_000}})


def make_app(svc: FakeJobsService, base: str = "/services/trainhub/api") -> tornado.web.Application:
    kw = {"svc": svc}
    return tornado.web.Application([
        (base + r"/?", RootHandler, kw),
        (base + r"/workdirs/([0-9a-f]{64})", WorkdirHandler, kw),
        (base + r"/jobs", JobsHandler, kw),
        (base + r"/jobs/([^/]+)", JobHandler, kw),
        (base + r"/jobs/([^/]+)/logs", LogsHandler, kw),
        (base + r"/jobs/([^/]+)/metrics", MetricsHandler, kw),
    ])


class ServerThread:
    """Runs the app on 127.0.0.1:<free port> in a daemon thread; ``url`` is the API base URL."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="trainhub-contract-")
        self.service = FakeJobsService(Path(self.tmp.name))
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/services/trainhub/api"
        self.token = TOKEN
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            server = tornado.httpserver.HTTPServer(make_app(self.service))
            server.add_sockets(sockets)
            self.loop.call_soon(started.set)
            self.loop.run_forever()
            server.stop()

        self.thread = threading.Thread(target=run, daemon=True, name="jobs-contract-server")
        self.thread.start()
        started.wait(10)

    def stop(self):
        self.service.reset()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.tmp.cleanup()
