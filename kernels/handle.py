"""``JobHandle``: what ``%%train --as VAR`` binds, a small object over one job.

The handle itself is the core's (:class:`trainhub.handle.JobHandle`: status, logs, metrics, wait,
result...); the kernel side adds the live panel under the cell (``show()``).
"""

from __future__ import annotations

from trainhub.handle import JobFailedError, RemoteCall, Table, metrics_table  # noqa: F401  (the kernel side's names)
from trainhub.handle import JobHandle as _JobHandle


class JobHandle(_JobHandle):
    """One job: ``status`` (refreshed), ``job`` (last seen), ``logs()``, ``metrics()``, ``cancel()``,
    ``wait()``, ``result()``, ``show()`` (the live panel)."""

    def show(self):
        """Display the live panel again (in a notebook)."""
        from IPython.display import display

        if self.panel is None:
            from trainhub.kernels.widget import JobPanel

            self.panel = JobPanel(self.client, self.job).start()
        display(self.panel)
