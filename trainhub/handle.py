"""``JobHandle``: a small object over one job, for any Python program.

``%%train --as VAR`` binds the kernel side's subclass (:mod:`trainhub.kernels.handle`, which adds the
live panel); ``@trainhub.remote``'s ``.submit()`` returns :class:`RemoteCall`. ``result()`` waits for
the job and returns the values it sent back (:mod:`trainhub.results`).
"""

from __future__ import annotations

import html

from trainhub import results
from trainhub.fmt import elapsed_seconds, fmt_devices, fmt_duration, fmt_number, metrics_rows, text_table
from trainhub.states import JOB_TERMINAL, SUCCEEDED


class JobFailedError(RuntimeError):
    """A job waited on ended in failed, cancelled or lost."""

    def __init__(self, job: dict, log_tail: str = ""):
        self.job = job
        msg = f"job {job.get('id')} {job.get('state')}"
        if job.get("reason"):
            msg += f": {job['reason']}"
        if job.get("exit_codes"):
            msg += f" (exit codes {job['exit_codes']})"
        if log_tail.strip():
            msg += "\nlast log lines:\n" + log_tail.rstrip()
        super().__init__(msg)


class Table(list):
    """Rows (dicts) with a notebook HTML view; used when pandas is not installed."""

    def __init__(self, rows=(), columns=None):
        super().__init__(rows)
        self.columns = list(columns) if columns is not None else list(dict.fromkeys(k for r in self for k in r))

    def column(self, name: str) -> list:
        return [r.get(name) for r in self]

    def __repr__(self):
        if not self:
            return "(empty table: " + ", ".join(self.columns) + ")"
        return text_table([[fmt_number(r.get(c), none="") for c in self.columns] for r in self], self.columns)

    def _repr_html_(self):
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt_number(r.get(c), none=''))}</td>" for c in self.columns) + "</tr>"
                       for r in self)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def metrics_table(metrics: dict):
    """The API's metrics as a table: a pandas DataFrame when pandas is installed, else a :class:`Table`.
    One row per record: step, worker, time, then one column per metric."""
    columns, rows = metrics_rows(metrics)
    try:
        import pandas as pd
    except ImportError:
        return Table(rows, columns)
    df = pd.DataFrame(rows, columns=columns)
    if len(df):
        df["time"] = pd.to_datetime(df["time"], utc=True, errors="coerce")
    return df


class JobHandle:
    """One job: ``status`` (refreshed), ``job`` (last seen), ``logs()``, ``metrics()``, ``cancel()``, ``wait()``."""

    def __init__(self, client, job: dict, panel=None):
        self.client = client
        self.id = job["id"]
        self.job = job
        self.panel = panel

    def refresh(self) -> dict:
        self.job = self.client.get(self.id)
        return self.job

    @property
    def status(self) -> str:
        """The job's current state (asks the API)."""
        return self.refresh()["state"]

    @property
    def done(self) -> bool:
        return self.status in JOB_TERMINAL

    def logs(self, worker: int | None = None, tail: int | None = None) -> str:
        return self.client.logs(self.id, worker=worker, tail=tail)

    def print_logs(self, worker: int | None = None, tail: int | None = None) -> None:
        print(self.logs(worker, tail), end="")

    def metrics(self):
        """Reported metrics as a DataFrame (pandas) or a :class:`Table`."""
        return metrics_table(self.client.metrics(self.id))

    def gpu_metrics(self):
        gpu = (self.client.metrics(self.id) or {}).get("gpu", [])
        return Table(gpu)

    def cancel(self) -> dict:
        self.job = self.client.cancel(self.id)
        return self.job

    def wait(self, poll: float = 1.0, timeout: float | None = None, raise_on_failure: bool = True) -> dict:
        """Block until the job ends; raise :class:`JobFailedError` if it did not succeed
        (unless ``raise_on_failure=False``). Returns the job."""
        job = self.client.wait(self.id, poll=poll, callback=lambda j: setattr(self, "job", j), timeout=timeout)
        if raise_on_failure and job["state"] != SUCCEEDED:
            try:
                tail = self.client.logs(self.id, tail=20)
            except Exception:
                tail = ""
            raise JobFailedError(job, tail)
        return job

    def register_model(self, name: str, path: str | None = None, *, description: str = "", metrics: dict | None = None,
                       params: dict | None = None, datasets=(), stage: str | None = None) -> dict:
        """Register this job's outputs (or ``path`` inside them) as the next version of model ``name``.

        The files are copied immutably into the model registry; the job's final metrics and params,
        its sweep and the given ``datasets`` (``"name:version"``) are recorded. Returns the version.
        """
        return self.client.register_model(name, self.id, path=path, description=description, metrics=metrics,
                                          params=params, datasets=datasets, stage=stage)

    def result(self, timeout: float | None = None, poll: float = 1.0) -> dict:
        """Wait for the job to end (if it has not), then return the values it sent back, ``{name: value}``
        (``%%train --return NAME``; torch tensors on the CPU). Raises :class:`JobFailedError` when the
        job did not succeed and ``trainhub.results.ResultsError`` when it sent none or some could not be
        sent (its ``.values`` holds the others). Values are read from the job's storage area."""
        job = self.job if self.job.get("state") == SUCCEEDED else self.wait(poll=poll, timeout=timeout)
        return results.load(job)

    def __repr__(self):
        j = self.job
        return (f"<JobHandle {self.id} {j.get('state')} (when last seen), {fmt_devices(j)}, elapsed "
                f"{fmt_duration(elapsed_seconds(j))}: .status .logs() .metrics() .cancel() .wait() .result() "
                ".register_model()>")


class RemoteCall(JobHandle):
    """A ``@trainhub.remote`` function running as a job: ``result()`` is the function's return value."""

    def __init__(self, client, job: dict, function: str = ""):
        super().__init__(client, job)
        self.function = function

    def result(self, timeout: float | None = None, poll: float = 1.0):
        """Wait for the job, then the function's return value (rank 0's). Raises :class:`JobFailedError`
        (with the job's last log lines: the traceback) when the function raised."""
        return super().result(timeout=timeout, poll=poll)["return"]

    def __repr__(self):
        return f"<RemoteCall {self.function}() as {self.id} {self.job.get('state')} (when last seen): .result() .status .logs() .cancel()>"
