"""The ``%%train`` cell magic and the ``%train`` line magics.

``%%train [flags]`` submits the cell as a batch job (with the notebook context it needs, see
:mod:`trainhub.kernels.context`), shows a live panel under the cell and returns a
:class:`~trainhub.kernels.handle.JobHandle`. ``%train list|status|logs|cancel|help`` manage jobs.
Mistakes (unknown flags, syntax errors, values that can't be sent, API refusals such as quota)
are reported as ``UsageError``: one message, no traceback, nothing submitted.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from traitlets import Float, Integer, Unicode

from trainhub.backoff import Backoff
from trainhub.fmt import elapsed_seconds, fmt_duration, format_job, plural, state_text
from trainhub.jobspec import add_spec_options, add_workdir_options, parse_states, spec_from_args, workdir_summary
from trainhub.kernels.context import CellSyntaxError, build_job_script, check_returns, left_out_message
from trainhub.kernels.handle import running_cell
from trainhub.states import JOB_STATES, SUCCEEDED
from trainhub.workdir import scan

CELL_HELP = """\
Run this cell as a batch job on the platform's GPUs.

Imports, functions, classes and constants from cells you already ran are sent along when the
cell uses them; other small values (up to TrainMagics.max_value_bytes pickled) too. The job runs
in a copy of the notebook's folder (its modules import, relative paths work; .gitignore and
.trainhubignore respected): --workdir DIR sends another, --no-workdir none. Inside the job use
trainhub.log_metrics(step=..., loss=...), trainhub.outputs_dir(), trainhub.params().
Without --gpus or --profile the job gets this server's profile (its GPUs per worker); --gpus 0 for none.
"""

LINE_HELP = """\
%train list [--state S] [--all]     your jobs, newest first
%train status ID                    a job's live panel (or summary)
%train logs ID [--tail N] [--worker N] [--follow]
%train cancel ID [ID ...]
%train result ID [--as VAR]         wait for a job, then set the values it sent back (%%train --return)
%train help                         this help and the %%train flags
"""


HELP_FLAGS = ("-h", "--help")


def help_cells(lines: list[str]) -> list[str]:
    """An IPython input transformer: a ``%%train`` or ``%%sweep`` cell asking for ``--help`` (or ``-h``) gets a body
    line when it has none, so the magic prints its usage: IPython refuses a cell magic with an empty body before
    calling it ("cell body is empty"). Installed by ``load_ipython_extension``; every other cell is left as it is."""
    if not lines or not lines[0].startswith(("%%train", "%%sweep")) or "".join(lines[1:]).strip():
        return lines
    first = lines[0].rstrip("\n")
    name, _, args = first[2:].partition(" ")
    try:
        words = shlex.split(args)
    except ValueError:
        return lines
    if name in ("train", "sweep") and any(w in HELP_FLAGS for w in words):
        return [first + "\n", "\n"]
    return lines


class _UsageParser(argparse.ArgumentParser):
    """argparse that raises UsageError (usage and valid flags) instead of exiting the kernel."""

    def error(self, message):
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}\nRun '%train help' for details; nothing was submitted.")

    def exit(self, status=0, message=None):
        raise UsageError(message or "")

    def print_help(self, file=None):
        print(self.format_help(), file=file or sys.stdout)
        raise _HelpShown()


class _HelpShown(Exception):
    pass


def server_profile_default(spec: dict) -> str | None:
    """``%%train`` and ``%%sweep`` without ``--gpus`` or ``--profile`` run on this server's profile
    (``$TRAINHUB_PROFILE``): its GPUs per worker, as docs/notebooks.md says. Sets ``spec["profile"]`` and returns it;
    None (spec unchanged) when the flags chose, or outside a platform server."""
    profile = os.environ.get("TRAINHUB_PROFILE", "").strip()
    if not profile or spec.get("gpus") is not None or spec.get("profile"):
        return None
    spec["profile"] = profile
    return profile


def profile_note(profile: str) -> str:
    return f"as this server's profile {profile}"


def cell_number(shell) -> int:
    """The running cell's number as its prompt shows it (``[2]``): IPython has already counted the cell in
    ``execution_count`` while it runs; the display hook's result holds the cell's own number."""
    return running_cell(shell) or max(int(getattr(shell, "execution_count", 1) or 1) - 1, 0)


def cell_parser() -> argparse.ArgumentParser:
    # no abbreviations: --gpu must be an unknown flag, not silently --gpus
    p = _UsageParser(prog="%%train", description=CELL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                     allow_abbrev=False)
    add_spec_options(p)
    add_workdir_options(p, default="the notebook's folder")
    p.add_argument("--wait", action="store_true", help="block until the job ends; fail the cell if the job fails")
    p.add_argument("--as", dest="as_var", metavar="VAR", help="bind the JobHandle to VAR (it is also the cell's result, _)")
    p.add_argument("--return", dest="returns", metavar="NAME[,NAME...]", type=return_names, default=[],
                   help="send these variables' values back from rank 0 when the cell has finished: with --wait they "
                   "are set here, else job.result() or %%train result ID returns them")
    p.add_argument("--ignore-missing", action="store_true",
                   help="submit even if some variables the cell uses cannot be sent (too big / not picklable)")
    p.add_argument("--dry-run", action="store_true", help="print the generated job script, submit nothing")
    return p


def return_names(text: str) -> list[str]:
    """``--return model,acc`` -> ["model", "acc"] (Python names, no duplicates)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected Python names separated by commas (--return model,acc), got {text!r}")
    return list(dict.fromkeys(names))


def line_parser() -> argparse.ArgumentParser:
    p = _UsageParser(prog="%train", description=LINE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                     allow_abbrev=False)
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=_UsageParser)
    ls = sub.add_parser("list", help="list your jobs", allow_abbrev=False)
    ls.add_argument("--state", action="append", default=[], metavar="S", help=f"only these states ({', '.join(JOB_STATES)})")
    ls.add_argument("--all", action="store_true", help="everyone's jobs (admins)")
    ls.add_argument("--limit", type=int, default=20, metavar="N")
    st = sub.add_parser("status", help="show a job", allow_abbrev=False)
    st.add_argument("id", metavar="ID")
    lg = sub.add_parser("logs", help="print a job's logs", allow_abbrev=False)
    lg.add_argument("id", metavar="ID")
    lg.add_argument("--tail", type=int, metavar="N")
    lg.add_argument("--worker", type=int, metavar="N")
    lg.add_argument("--follow", "-f", action="store_true")
    c = sub.add_parser("cancel", help="cancel jobs", allow_abbrev=False)
    c.add_argument("id", metavar="ID", nargs="+")
    r = sub.add_parser("result", help="set the values a job sent back (--return) in this notebook", allow_abbrev=False)
    r.add_argument("id", metavar="ID")
    r.add_argument("--as", dest="as_var", metavar="VAR", help="bind them as one dict to VAR instead of one variable each")
    r.add_argument("--timeout", type=float, metavar="S", help="seconds to wait for a job still running (default: no limit)")
    sub.add_parser("help", help="show help")
    return p


def parse_line(parser: argparse.ArgumentParser, line: str) -> argparse.Namespace | None:
    """Parse a magic line; None when --help was shown."""
    try:
        argv = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"cannot parse the arguments ({e}): {line}") from None
    try:
        return parser.parse_args(argv)
    except _HelpShown:
        return None


@magics_class
class TrainMagics(Magics):
    """``%%train`` and ``%train``. Configure with ``%config TrainMagics.max_value_bytes = 10_000_000``."""

    max_value_bytes = Integer(
        1_000_000, help="largest pickled size (bytes) of one notebook value sent with a %%train job; bigger "
        "values are refused with advice to pass them through storage. 0 = send no values.").tag(config=True)
    poll_interval = Float(1.0, help="seconds between refreshes of the job panel (and --wait polls).").tag(config=True)
    api_url = Unicode("", help="jobs API base URL; empty = $TRAINHUB_API_URL.").tag(config=True)
    api_token = Unicode("", help="JupyterHub API token; empty = $JUPYTERHUB_API_TOKEN.").tag(config=True)

    def __init__(self, shell=None, **kw):
        super().__init__(shell=shell, **kw)
        self._client = None

    # -- helpers ----------------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            from trainhub.client import TrainhubClient, TrainhubConfigError

            try:
                self._client = TrainhubClient(url=self.api_url or None, token=self.api_token or None)
            except TrainhubConfigError as e:
                msg = str(e).replace("pass --url/--token", "run %config TrainMagics.api_url = '...' and "
                                     "TrainMagics.api_token = '...'")
                raise UsageError(msg + "; nothing was submitted.") from None
        return self._client

    @client.setter
    def client(self, value):
        self._client = value

    def _call(self, what: str, fn, *a, **kw):
        from trainhub.client import TrainhubAPIError

        try:
            return fn(*a, **kw)
        except TrainhubAPIError as e:
            raise UsageError(f"{what}: {e}") from None
        except ValueError as e:
            raise UsageError(f"{what}: {e}") from None

    def _submit(self, what: str, fn, spec: dict, profile: str | None):
        """Submit ``spec`` (a job or a sweep); when its GPUs came from this server's profile, say so (stdout), and
        with a refusal say how to choose others."""
        try:
            made = self._call(what, fn, spec)
        except UsageError as e:
            if not profile:
                raise
            raise UsageError(f"{e}\n(without --gpus {profile_note(profile)}; pass --gpus N, e.g. --gpus 0, to choose)") from None
        gpus = made.get("gpus")  # a sweep's trials resolve theirs when they start
        if profile and gpus != 0:
            per_worker = f"{plural(gpus, 'GPU')} per worker, " if gpus else ""
            print(f"{made['id']}: {per_worker}{profile_note(profile)} (--gpus N to choose)")
        return made

    def _widgets(self) -> bool:
        """Widgets only in a kernel with a frontend (not in terminal IPython or plain shells)."""
        if getattr(self.shell, "kernel", None) is None:
            return False
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            return False
        return True

    def _prepare(self, parser, line: str, cell: str, magic: str, what: str):
        """Parse the magic's flags and build the job script from the cell and the kernel's history.

        Returns ``(args, script)``, or None after ``--help``; every mistake (bad flag, bad ``--as``,
        empty cell, syntax error, values that cannot be carried) is a UsageError and nothing is submitted.
        """
        args = parse_line(parser, line)
        if args is None:
            return None
        if args.as_var is not None and not args.as_var.isidentifier():
            raise UsageError(f"--as {args.as_var!r}: not a Python variable name; nothing was submitted.")
        if not cell.strip():
            raise UsageError(f"the {magic} cell is empty: put the {what} below the {magic} line.")
        history = list(self.shell.history_manager.input_hist_raw) if self.shell is not None else []
        try:
            script = build_job_script(cell, history, self.shell.user_ns, max_value_bytes=self.max_value_bytes,
                                      transform=self.shell.transform_cell, line_offset=1,
                                      returns=getattr(args, "returns", None),
                                      workdir=not args.no_workdir)
        except CellSyntaxError as e:
            where = f"line {e.lineno} of the cell" if e.lineno else "the cell"
            pointer = f"\n    {e.line.strip()}" if e.line else ""
            raise UsageError(f"syntax error in {where}: {e.msg}{pointer}\nNothing was submitted.") from None
        if script.left_out and not args.ignore_missing:
            raise UsageError(left_out_message(script, self.max_value_bytes).replace("%%train", magic))
        never = check_returns(cell, getattr(args, "returns", None) or [], script)
        if never:
            raise UsageError(f"--return {', '.join(never)}: the cell never assigns {'it' if len(never) == 1 else 'them'} "
                             f"and the job would not have {'it' if len(never) == 1 else 'them'}; nothing was submitted.")
        return args, script

    def _present(self, handle, make_panel, text: str, as_var: str | None) -> None:
        """Bind ``--as VAR``, then show a live panel under the cell (or one line where widgets cannot render)."""
        if as_var:
            self.shell.user_ns[as_var] = handle
        if self._widgets():
            from IPython.display import display

            handle.panel = make_panel().start()
            handle.shown_in_cell = cell_number(self.shell)
            display(handle.panel)
        else:
            print(text)

    # -- the magic --------------------------------------------------------------------------------
    @line_cell_magic
    def train(self, line: str, cell: str | None = None):
        """%%train [--gpus N] [--workers W] [--name NAME] [--profile P] [--env K=V ...] [--time-limit T]
        [--retries R] [--wait] [--as VAR]: run the cell as a batch job. %train help: the line magics."""
        __tracebackhide__ = True
        if cell is None:
            return self._line(line)
        return self._cell(line, cell)

    def _cell(self, line: str, cell: str):
        __tracebackhide__ = True
        from trainhub.kernels.handle import JobFailedError, JobHandle

        prepared = self._prepare(cell_parser(), line, cell, "%%train", "training code")
        if prepared is None:
            return None
        args, script = prepared
        folder = None if args.no_workdir else (args.workdir or os.getcwd())
        if args.dry_run:
            print(script.source)
            self._report_context(script)
            if folder is not None:
                listing = self._call("the working directory cannot be sent", scan, folder, exclude=args.exclude)
                print(f"%%train would send the working directory {listing.root}: "
                      f"{workdir_summary({'files': listing.files, 'bytes': listing.bytes, 'skipped': listing.skipped})}")
            return None
        spec = spec_from_args(args, script=script.source)
        spec.setdefault("name", f"notebook-cell-{cell_number(self.shell)}")
        sent = None
        if folder is not None:  # the notebook's folder: the job runs in a copy of it (trainhub.workdir)
            sent = self._call("the job was not submitted", self.client.send_workdir, folder, exclude=args.exclude)
            spec["workdir"] = sent["sha256"]
        profile = server_profile_default(spec)
        job = self._submit("the job was not submitted", self.client.submit, spec, profile)
        self._report_context(script)
        if sent is not None:
            print(f"%%train sent the working directory {sent['folder']}: {workdir_summary(sent)}")
        handle = JobHandle(self.client, job)

        def panel():
            from trainhub.kernels.widget import JobPanel

            return JobPanel(self.client, job, poll=self.poll_interval)

        self._present(handle, panel, f"submitted {job['id']}: {state_text(job)}", args.as_var)
        if args.wait:
            job = self._wait(handle)
            if job.get("state") != SUCCEEDED:
                try:
                    tail = self.client.logs(job["id"], tail=20) if handle.panel is None else ""
                except Exception:
                    tail = ""
                raise JobFailedError(job, tail)
            if args.returns:
                self._set_results(handle, None)
        return handle

    def _set_results(self, handle, as_var: str | None) -> dict:
        """Read the values a finished job sent back and set them in the notebook (one variable each, or
        one dict ``as_var``); a value that could not be sent or read is a UsageError naming it and why."""
        from trainhub.results import ResultsError

        try:
            values = handle.result()
        except ResultsError as e:
            if e.values:
                self.shell.user_ns.update(e.values)
                print(f"%train: set {', '.join(e.values)} from {handle.id}")
            raise UsageError(f"the values of {handle.id} could not all come back: {e}") from None
        if as_var:
            self.shell.user_ns[as_var] = values
            print(f"%train: {as_var} = the values {handle.id} sent back ({', '.join(values)})")
        else:
            self.shell.user_ns.update(values)
            print(f"%train: set {', '.join(values)} from {handle.id}")
        return values

    def _report_context(self, script, magic: str = "%%train") -> None:
        """What the capture carried (information, on stdout) and what it could not (warnings, on stderr). Every
        message of these magics that only informs (values set, waiting stopped) goes to stdout; stderr, which a
        notebook shows as a red box, is kept for what may break the job."""
        notes = []
        if script.carried_code:
            notes.append("from earlier cells: " + ", ".join(script.carried_code))
        if script.carried_values:
            notes.append("values: " + ", ".join(script.carried_values))
        if notes:
            print(f"{magic} sent " + "; ".join(notes))
        if script.left_out:
            print(f"{magic} did NOT send (the job fails if it uses them): " + ", ".join(sorted(script.left_out)),
                  file=sys.stderr)
        if script.undefined:
            print(f"{magic}: not defined in this kernel, the job will fail if it uses them: "
                  + ", ".join(script.undefined), file=sys.stderr)

    def _wait(self, handle) -> dict:
        """Block until the job ends (Ctrl-C / interrupt stops waiting, not the job)."""
        try:
            if handle.panel is not None:
                # the panel's own thread polls; wake every 0.2 s so an interrupt reaches this loop
                pause = Backoff(f"the panel of {handle.id} to see the job end", start=0.2, factor=1.0)
                while not pause.sleep(until=handle.panel.done):
                    pass
                return handle.refresh()
            return self._wait_text(handle)
        except KeyboardInterrupt:
            print(f"stopped waiting; {handle.id} keeps running (cancel it with %train cancel {handle.id} "
                  "or the Cancel button)")
            raise

    def _wait_text(self, handle) -> dict:
        """Where widgets cannot render: print each state change and the new log lines until the job ends."""
        last_state, seen = None, 0

        def show(job):
            nonlocal last_state, seen
            handle.job = job
            if job["state"] != last_state:
                print(f"{handle.id} {job['state']}" + (f": {job['reason']}" if job.get("reason") else ""))
                last_state = job["state"]
            try:
                lines = self.client.logs(handle.id).splitlines()
            except Exception:
                lines = []
            for ln in lines[seen:]:
                print(ln)
            seen = max(seen, len(lines))

        job = self.client.wait(handle.id, poll=self.poll_interval, callback=show)
        print(f"{handle.id} {job['state']} after {fmt_duration(elapsed_seconds(job))}")
        return job

    # -- line magics ------------------------------------------------------------------------------
    def _line(self, line: str):
        __tracebackhide__ = True
        if not line.strip():
            line = "help"
        args = parse_line(line_parser(), line)
        if args is None:
            return None
        if args.action == "help":
            print(LINE_HELP)
            print(cell_parser().format_help())
            return None
        if args.action == "list":
            return self._list(args)
        if args.action == "status":
            job = self._call(f"cannot show {args.id}", self.client.get, args.id)
            if self._widgets():
                from IPython.display import display

                from trainhub.kernels.widget import JobPanel

                display(JobPanel(self.client, job, poll=self.poll_interval).start())
            else:
                print(format_job(job))
            return None
        if args.action == "logs":
            if args.follow:
                try:
                    for ln in self._call(f"cannot read the logs of {args.id}", self.client.follow_logs, args.id,
                                         worker=args.worker, tail=args.tail):
                        print(ln, flush=True)
                except KeyboardInterrupt:
                    pass
            else:
                print(self._call(f"cannot read the logs of {args.id}", self.client.logs, args.id,
                                 worker=args.worker, tail=args.tail), end="")
            return None
        if args.action == "result":
            return self._result(args)
        if args.action == "cancel":
            for job_id in args.id:
                job = self._call(f"cannot cancel {job_id}", self.client.cancel, job_id)
                print(f"{job['id']}: {state_text(job)}")
            return None
        return None

    def _result(self, args):
        """``%train result ID``: wait for the job if needed (an interrupt stops waiting), then set its values."""
        from trainhub.kernels.handle import JobFailedError, JobHandle

        if args.as_var is not None and not args.as_var.isidentifier():
            raise UsageError(f"--as {args.as_var!r}: not a Python variable name")
        handle = JobHandle(self.client, self._call(f"cannot find {args.id}", self.client.get, args.id))
        try:
            handle.wait(poll=self.poll_interval, timeout=args.timeout)
        except KeyboardInterrupt:
            print(f"stopped waiting; {handle.id} keeps running")
            raise
        except JobFailedError as e:
            raise UsageError(str(e)) from None
        except TimeoutError as e:
            raise UsageError(f"{handle.id} is still {handle.job.get('state')}: {e}") from None
        self._set_results(handle, args.as_var)
        return None

    def _list(self, args):
        from trainhub.kernels.handle import Table

        try:
            states = parse_states(args.state, JOB_STATES)
        except ValueError as e:
            raise UsageError(str(e)) from None
        user = None if args.all else self.client.whoami()
        page = self._call("cannot list jobs", self.client.list, state=states or None, user=user, limit=args.limit)
        rows = [{"id": j["id"], "name": j.get("name") or "", "user": j.get("user", ""), "state": j.get("state"),
                 "gpus": f"{j.get('gpus')}x{j.get('workers', 1)}", "created": (j.get("created") or "")[:19],
                 "elapsed": fmt_duration(elapsed_seconds(j)), "reason": j.get("reason") or ""}
                for j in page.get("items", [])]
        if not rows:
            print("no jobs")
            return None
        return Table(rows)
