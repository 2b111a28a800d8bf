"""``JobHandle``: what ``%%train --as VAR`` binds, a small object over one job.

The handle itself is the core's (:class:`trainhub.handle.JobHandle`: status, logs, metrics, wait,
result...); the kernel side adds the live panel under the cell (``show()``).
"""

from __future__ import annotations

from trainhub.handle import JobFailedError, RemoteCall, Table, metrics_table  # noqa: F401  (the kernel side's names)
from trainhub.handle import JobHandle as _JobHandle


def running_cell(shell) -> int | None:
    """The number of the cell running now ([2]), None outside one."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    return getattr(result, "execution_count", None) or None


def settle(panel, timeout: float = 30.0) -> None:
    """Wait (at most ``timeout`` s) for a live panel whose job or sweep has ended to see the end and publish its final
    static form (trainhub.kernels.widget.StaticForm); nothing for no panel or one that is not polling."""
    thread = getattr(panel, "_thread", None)
    if thread is not None and thread.is_alive():
        panel.done.wait(timeout)
    done = getattr(panel, "done", None)
    if done is not None and done.is_set():
        # once more under this cell: the thread's last publish may have gone out between two cells, where no frontend
        # takes it (nbclient keeps only the running cell's messages)
        panel.publish(force=True)


class LiveDisplay:
    """How a handle shows itself as a cell's value: never a snapshot that goes stale.

    Under the cell whose magic made it, nothing: the live panel is right above. In a later cell, the
    live panel again (another view of the same widget); without a panel, the state as of now.
    """

    panel = None
    shown_in_cell: int | None = None  # set by the magic that displayed the panel

    def _ipython_display_(self):
        from IPython import get_ipython
        from IPython.display import display

        if self.panel is not None:
            if self.shown_in_cell is not None and running_cell(get_ipython()) == self.shown_in_cell:
                return
            display(self.panel)
            return
        try:
            self.refresh()
        except Exception:  # the API is away: show what was seen last (its repr says when)
            pass
        display({"text/plain": repr(self)}, raw=True)


class JobHandle(LiveDisplay, _JobHandle):
    """One job: ``status`` (refreshed), ``job`` (last seen), ``logs()``, ``metrics()``, ``cancel()``,
    ``wait()``, ``result()``, ``show()`` (the live panel)."""

    def wait(self, poll: float = 1.0, timeout: float | None = None, raise_on_failure: bool = True) -> dict:
        """Block until the job ends (see the core's ``JobHandle.wait``); with a live panel, also until the panel has
        published its final static form, so a notebook run headless and saved after this cell shows the end."""
        try:
            job = super().wait(poll=poll, timeout=timeout, raise_on_failure=raise_on_failure)
        except JobFailedError:
            settle(self.panel)
            raise
        settle(self.panel)
        return job

    def show(self):
        """Display the live panel again (in a notebook)."""
        from IPython.display import display

        if self.panel is None:
            from trainhub.kernels.widget import JobPanel

            self.panel = JobPanel(self.client, self.job).start()
        display(self.panel)
