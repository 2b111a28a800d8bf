"""Canned sweeps-API answers and a client stand-in for the %%sweep unit tests."""

from __future__ import annotations

import copy

SWEEP = {"id": "s-000001", "name": "nb", "user": "alice", "state": "running", "reason": "", "metric": "val_loss",
         "mode": "min", "trials": 3, "parallel": 2, "sampler": "tpe", "pruner": "median", "space": {},
         "progress": {"pending": 0, "running": 2, "complete": 0, "pruned": 0, "failed": 0, "cancelled": 0, "done": 0},
         "best": None, "importance": None}
TRIALS = [
    {"number": 0, "state": "complete", "params": {"lr": 0.01, "opt": "adam"}, "value": 0.25,
     "intermediate": [[0, 0.9], [1, 0.25]], "job_id": "j-000001", "reason": "val_loss = 0.25"},
    {"number": 1, "state": "pruned", "params": {"lr": 0.5, "opt": "sgd"}, "value": 2.0,
     "intermediate": [[0, 2.0]], "job_id": "j-000002", "reason": "pruned at step 0"},
    {"number": 2, "state": "complete", "params": {"lr": 0.02, "opt": "adam"}, "value": 0.2,
     "intermediate": [[0, 0.8], [1, 0.2]], "job_id": "j-000003", "reason": "val_loss = 0.2"},
]
DONE = {**SWEEP, "state": "completed", "reason": "best val_loss = 0.2",
        "progress": {"pending": 0, "running": 0, "complete": 2, "pruned": 1, "failed": 0, "cancelled": 0, "done": 3},
        "best": {"number": 2, "value": 0.2, "params": {"lr": 0.02, "opt": "adam"}, "job_id": "j-000003",
                 "outputs_url": "file:///data/alice/jobs/j-000003", "outputs_path": "/jobs/j-000003/outputs"},
        "importance": {"lr": 0.8, "opt": 0.2}}


class FakeSweepsClient:
    def __init__(self):
        self.created: list[dict] = []
        self.cancelled: list[str] = []
        self.registered: list[tuple] = []
        self.workdirs: list[tuple] = []  # (folder, exclude, the archive's member names) per send_workdir

    def send_workdir(self, folder, *, exclude=()):
        """As JobsAPI.send_workdir, the archive packed for real (trainhub.workdir) but kept here."""
        import tarfile

        from trainhub import workdir

        snap = workdir.snapshot(folder, exclude=exclude)
        with snap.archive, tarfile.open(fileobj=snap.archive, mode="r:gz") as tar:
            self.workdirs.append((snap.root, tuple(exclude), sorted(tar.getnames())))
        return {"sha256": snap.sha256, "files": snap.files, "bytes": snap.bytes, "entries": snap.entries,
                "skipped": snap.skipped, "folder": snap.root}

    def create_sweep(self, body):
        self.created.append(body)
        return {**copy.deepcopy(SWEEP), "trials": body["trials"], "parallel": body["parallel"]}

    def get_sweep(self, sweep_id):
        return copy.deepcopy(DONE)

    def sweep_trials(self, sweep_id):
        return copy.deepcopy(TRIALS)

    def wait_sweep(self, sweep_id, poll=1.0, timeout=None, callback=None):
        return copy.deepcopy(DONE)

    def register_model(self, name, job=None, **kw):
        self.registered.append((name, job, kw))
        return {"name": name, "version": 1, "job": job}

    def cancel_sweep(self, sweep_id):
        self.cancelled.append(sweep_id)
        return {**copy.deepcopy(SWEEP), "reason": "cancelling (requested by alice)"}
