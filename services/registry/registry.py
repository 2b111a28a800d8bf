"""The registries' behaviour: validating registrations, scanning and copying files, retention."""

from __future__ import annotations

import asyncio
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

from sqlalchemy import select
from traitlets import Float, Integer, Unicode
from traitlets.config import LoggingConfigurable

from trainhub.backoff import within
from trainhub.boundary.asuser import storage_tree
from trainhub.exceptions import Conflict, Forbidden, InvalidRequest, NotFound
from trainhub.fmt import as_utc
from trainhub.loops import PeriodicLoop
from trainhub.services.jobs.models import Job, JobEvent, parse_job_key
from trainhub.states import JOB_TERMINAL
from trainhub.storage import resolve_in_area

from . import files as fileops
from .store import RegistryStore, dataset_version_dict, model_version_dict

WRITE = "custom:trainhub:registry:write"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Registry(LoggingConfigurable):
    """Dataset and model registries of one jobs service (``service.registry``)."""

    models_prefix = Unicode("models", help="Folder under the storage root holding registered model versions (<root>/<prefix>/<name>/v<N>/).").tag(config=True)

    job_outputs_retention_days = Float(
        0.0,
        help="Delete the outputs of finished jobs this many days after they end, unless registered as a model "
             "(registered versions are copies and stay forever). 0 = keep job outputs forever.",
    ).tag(config=True)

    retention_interval = Float(3600.0, help="Seconds between retention sweeps (with ±10% jitter).").tag(config=True)

    file_threads = Integer(4, help="Threads for storage work (scans, copies, exports).").tag(config=True)

    max_model_bytes = Integer(
        fileops.DEFAULT_MAX_MODEL_BYTES,
        help="Largest model version in bytes (e.g. 200 GiB), counted from the listing before anything is copied and "
             "again while copying (a file that grows meanwhile cannot make a copy endless); larger: 400.",
    ).tag(config=True)

    def __init__(self, service, **kw):
        super().__init__(parent=service, **kw)
        self.service = service
        self.storage = service.storage
        self.store = RegistryStore(service.db_url)
        self.pool = ThreadPoolExecutor(self.file_threads, thread_name_prefix="trainhub-registry")
        self.progress: dict[tuple, dict] = {}
        self.tasks: set[asyncio.Task] = set()  # scans in progress (kept until done; cancelled by stop())
        self._retention: PeriodicLoop | None = None
        self.utcnow = utcnow  # seam for tests

    async def run(self, fn, *a):
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*a))

    def _spawn(self, coro):
        t = asyncio.create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return t

    # -- where things are ----------------------------------------------------------------------
    def resolve_prefix(self, caller, path: str) -> str:
        """A storage path relative to the root (``datasets/x``, ``users/<me>/x``) -> full URL.

        Users may point at the shared ``datasets/`` area and their own area; admins anywhere.
        """
        if not isinstance(path, str) or not path.strip("/"):
            raise InvalidRequest("give 'path': a storage path such as 'datasets/mnist' or 'users/<you>/data'")
        root = self.storage.root()
        if path.startswith(root + "/"):
            path = path[len(root) + 1:]
        parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
        # resolved against the area it names (symbolic links included), never against the whole root:
        # a link in one's own area to another user's files is refused, not registered
        if parts[:1] == ["datasets"]:
            return resolve_in_area(f"{root}/datasets", "/".join(parts[1:]))
        if parts[:1] == ["users"] and len(parts) > 1 and parts[1] == caller.name:
            return resolve_in_area(f"{root}/users/{caller.name}", "/".join(parts[2:]))
        if caller.may_all(WRITE):
            return resolve_in_area(root, path)
        raise Forbidden(f"{path!r} is outside your storage area; register 'datasets/...' or 'users/{caller.name}/...'")

    def fs(self):
        return self.storage.filesystem()

    def source(self, url: str):
        """The files under ``url`` as a registration reads them: on the local storage as the owner of the folder
        (a user's area as that user), through descriptors (``fileops.TreeSource``); on S3 by key. Blocking.
        The caller closes it (``close_source``)."""
        path = self.storage.strip(url)
        if self.storage.is_local:
            tree, rel = storage_tree(self.storage, getattr(self.service, "isolation", None), path)
            return fileops.TreeSource(tree, rel)
        return fileops.FsSource(self.fs(), path)

    def _with_source(self, url: str, fn, *a):
        """``fn(source, *a)`` on a worker thread, the source closed after."""
        def work():
            src = self.source(url)
            try:
                return fn(src, *a)
            finally:
                close_source(src)

        return self.run(work)

    # -- datasets ------------------------------------------------------------------------------
    async def register_dataset(self, caller, name: str, body: dict, wait: float = 5.0) -> dict:
        url = self.resolve_prefix(caller, body.get("path") or body.get("prefix") or body.get("url") or "")
        if not await self._with_source(url, has_files):
            raise NotFound(f"nothing is stored under {url}; upload the data first")
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise InvalidRequest("'metadata' must be a JSON object")
        ds, v = await self.service.store.write(
            self.store.create_dataset_version, name, caller.name, caller.may_all(WRITE),
            url=url, format=str(body.get("format") or ""), description=str(body.get("description") or ""), meta=meta)
        self.log.info("dataset %s v%d registered by %s: %s (scanning)", name, v.version, caller.name, url)
        task = self._spawn(self._scan_dataset(v.id, url))
        try:
            await within(asyncio.shield(task), timeout=max(0.0, wait))
        except asyncio.TimeoutError:
            pass
        ds, v = await self.service.store.read(self.store.get_dataset_version, name, v.version)
        return dataset_version_dict(ds, v, self.progress.get(("dataset", v.id)))

    async def _scan_dataset(self, version_id: int, url: str) -> None:
        key = ("dataset", version_id)
        self.progress[key] = {"files": 0, "bytes": 0}

        def progress(n, size):
            self.progress[key] = {"files": n, "bytes": size}

        try:
            r = await self._with_source(url, fileops.scan, progress)
            await self.service.store.write(self.store.finish_dataset_scan, version_id, **r)
        except Exception as e:
            self.log.exception("scan of %s failed", url)
            await self.service.store.write(self.store.finish_dataset_scan, version_id, error=f"scan failed: {e}")
        finally:
            self.progress.pop(key, None)

    # -- models --------------------------------------------------------------------------------
    async def register_model(self, caller, name: str, body: dict) -> dict:
        lineage: dict = {}
        metrics, params = {}, {}
        if body.get("job"):
            job = await self._job(caller, str(body["job"]))
            base = job.outputs_url
            if not base:
                raise Conflict(f"job {job.key} has no outputs in storage")
            sub = str(body.get("path") or "")
            if sub:
                src = resolve_in_area(base, sub)
            else:
                # what the job wrote to trainhub.outputs_dir() (not its logs), when it has that folder
                src = f"{base}/outputs"
                if not await self._with_source(src, has_files):
                    src = base
            lineage.update(job=job.key, user=job.user)
            if job.sweep_id is not None:
                lineage["sweep"] = job.sweep_id
            params = dict(job.params or {})
            metrics = await self._final_metrics(job.id)
        elif body.get("path"):
            src = self.resolve_prefix(caller, str(body["path"]))
        else:
            require_source(body)
        datasets = []
        for ref in body.get("datasets") or []:
            if isinstance(ref, str):
                ref_name, _, ref_v = ref.partition(":")
            elif isinstance(ref, dict):
                ref_name, ref_v = ref.get("name"), ref.get("version")
            else:
                raise InvalidRequest(f"dataset reference {ref!r}: use 'name:version' or {{'name', 'version'}}")
            ds, dv = await self.service.store.read(self.store.get_dataset_version, str(ref_name), ref_v or "latest")
            datasets.append({"name": ds.name, "version": dv.version})
        if datasets:
            lineage["datasets"] = datasets
        for field, target in (("metrics", metrics), ("params", params)):
            extra = body.get(field) or {}
            if not isinstance(extra, dict):
                raise InvalidRequest(f"'{field}' must be a JSON object")
            target.update(extra)
        root = self.storage.root()
        m, v = await self.service.store.write(
            self.store.create_model_version, name, caller.name, caller.may_all(WRITE),
            lambda n: f"{root}/{self.models_prefix}/{name}/v{n}",
            source_url=src, description=str(body.get("description") or ""), metrics=metrics, params=params,
            lineage=lineage)
        self.log.info("model %s v%d registered by %s from %s (copying)", name, v.version, caller.name, src)
        d = model_version_dict(m, v)
        try:
            files, size = await self._with_source(src, fileops.copy_tree, self.fs(), self.storage.strip(v.url),
                                                  fileops.manifest_for(d), self.max_model_bytes)
        except FileNotFoundError as e:
            await self.service.store.write(self.store.finish_model_copy, v.id, error=str(e))
            raise NotFound(f"nothing to register: no files under {src}") from None
        except (fileops.TooManyFiles, fileops.SourceChanged, fileops.TooLarge) as e:
            await self.service.store.write(self.store.finish_model_copy, v.id, error=str(e))
            raise InvalidRequest(str(e)) from None
        except Exception as e:
            self.log.exception("copy of %s to %s failed", src, v.url)
            await self.service.store.write(self.store.finish_model_copy, v.id, error=f"copy failed: {e}")
            raise
        await self.service.store.write(self.store.finish_model_copy, v.id, files=files, size=size)
        if body.get("stage") and body["stage"] != "none":
            await self.service.store.write(self.store.set_stage, name, v.version, str(body["stage"]), caller.name,
                                           caller.may_all(WRITE), "set at registration")
        m, v, history = await self.service.store.read(self.store.get_model_version, name, v.version)
        return model_version_dict(m, v, history)

    async def _job(self, caller, key: str):
        job_id = parse_job_key(key)
        if job_id is None:
            raise InvalidRequest(f"{key!r} is not a job id (e.g. j-000042)")
        try:
            job = await self.service.store.read(self.service.store.get, job_id)
        except NotFound:
            raise NotFound(f"job {key} not found") from None
        if job.user != caller.name and not caller.may_all(WRITE):
            raise NotFound(f"job {key} not found")  # another user's job is not revealed
        if job.state not in JOB_TERMINAL:
            raise Conflict(f"job {job.key} is {job.state}; register its outputs once it has finished")
        return job

    async def _final_metrics(self, job_id: int) -> dict:
        try:
            data = await self.service.store.read(self.service.store.metrics, job_id)
        except Exception:
            return {}
        last: dict = {}
        for rec in data.get("metrics", []):
            last.update(rec.get("values") or {})
        return last

    async def build_bundle(self, version: dict) -> str:
        tmp = tempfile.NamedTemporaryFile(prefix="trainhub-bundle-", suffix=".tar.gz", delete=False)

        def work():
            with tmp:
                fileops.write_bundle(self.fs(), version, tmp)
            return tmp.name

        return await self.run(work)

    # -- retention -----------------------------------------------------------------------------
    def expire_job_outputs(self) -> list[str]:
        """Delete outputs of jobs finished longer ago than the retention (blocking). Returns job keys."""
        days = self.job_outputs_retention_days
        if not days or days <= 0:
            return []
        cutoff = self.utcnow() - timedelta(days=days)
        store = self.service.store
        with store.session() as s:
            done = {r for r in s.scalars(select(JobEvent.job_id).where(JobEvent.kind == "outputs_expired"))}
            jobs = [j for j in s.scalars(select(Job).where(Job.state.in_(tuple(JOB_TERMINAL)), Job.finished.is_not(None)))
                    if j.id not in done and j.outputs_url and as_utc(j.finished) < cutoff]
        expired = []
        for job in jobs:
            try:
                self._remove(job.outputs_url)
                store.update(job.id, event=("outputs_expired", f"outputs deleted after {days:g} days (retention)"))
                expired.append(job.key)
                self.log.info("outputs of job %s expired (finished %s)", job.key, job.finished)
            except Exception as e:
                self.log.warning("outputs of job %s not expired: %s", job.key, e)
        return expired

    def _remove(self, url: str) -> None:
        """Delete the folder at ``url`` (a job's outputs in its user's area): on the local storage as the user,
        through descriptors (a link inside is removed, never followed)."""
        path = self.storage.strip(url)
        if self.storage.is_local:
            tree, rel = storage_tree(self.storage, getattr(self.service, "isolation", None), path)
            with tree:
                if rel:
                    tree.rmtree(rel)
            return
        fs = self.fs()
        if fs.exists(path):
            fs.rm(path, recursive=True)

    async def expire_once(self) -> None:
        """One retention sweep (in the registry's threads)."""
        await self.run(self.expire_job_outputs)

    async def resume_pending(self) -> None:
        """Scans interrupted by a restart start again."""
        for ds, v in await self.service.store.read(self.store.pending_dataset_versions):
            self._spawn(self._scan_dataset(v.id, v.url))

    async def start(self) -> None:
        """Resume interrupted scans; start the retention sweeps (when job_outputs_retention_days > 0)."""
        await self.resume_pending()
        if self.job_outputs_retention_days > 0:
            self._retention = PeriodicLoop("trainhub-registry-retention", self.expire_once,
                                           lambda: self.retention_interval, self.log, jitter=0.1)
            self._retention.start()

    async def stop(self) -> None:
        """Stop the sweeps and running scans (a scan cut short resumes at the next start)."""
        if self._retention is not None:
            await self._retention.stop()
            self._retention = None
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.pool.shutdown(wait=False, cancel_futures=True)




def has_files(source) -> bool:
    """At least one file in ``source`` (the first page of its listing only)."""
    return next(iter(source.pages()), None) is not None


def close_source(source) -> None:
    tree = getattr(source, "tree", None)
    if tree is not None:
        tree.close()


def require_source(body: dict) -> None:
    """A model registration names what to copy: a job (with an optional path inside its outputs) or a path."""
    if not body.get("job") and not body.get("path"):
        raise InvalidRequest("give 'job' (a job id such as j-000042, optionally with 'path' inside its outputs) "
                             "or 'path' (a storage path in your area)")
