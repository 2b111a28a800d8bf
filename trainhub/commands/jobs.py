"""`trainhub jobs`: submit, list, inspect, follow and cancel batch jobs.

Talks to the jobs API (docs/jobs-api.md) through :class:`trainhub.client.TrainhubClient`:
``$TRAINHUB_API_URL`` and ``$JUPYTERHUB_API_TOKEN`` (set in platform terminals), or
``--url``/``--token``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from trainhub.cli import CommandError
from trainhub.fmt import (clip, state_text, elapsed_seconds, fmt_duration, fmt_number, format_diagnosis, format_events, format_job, last_log_line,
                          metrics_rows,
                          parse_time, text_table, wait_reason_text)
from trainhub.jobspec import add_spec_options, add_workdir_options, parse_states, spec_from_args, workdir_summary
from trainhub.states import JOB_STATES, QUEUED, RUNNING, SUCCEEDED


def add_parser(sub):
    p = sub.add_parser(
        "jobs",
        help="submit and manage batch jobs (the %%%%train back end)",
        description="Submit batch jobs to the platform's GPU pool and follow them. Works in platform terminals "
        "as is ($TRAINHUB_API_URL and $JUPYTERHUB_API_TOKEN are set there); elsewhere pass --url and --token "
        "(a token from `trainhub token NAME`).",
        epilog="Examples:\n  trainhub jobs submit train.py --gpus 1 --wait\n"
        "  trainhub jobs submit --workdir . --workers 2 -- python train.py --epochs 3\n"
        "  trainhub jobs submit --command 'python -m mypkg.train --lr 0.1' --workers 2\n"
        "  trainhub jobs list --state running\n  trainhub jobs logs j-000042 --follow",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    jobs = p.add_subparsers(dest="jobs_command", metavar="SUBCOMMAND", parser_class=type(p))

    s = jobs.add_parser(
        "submit", allow_abbrev=False, help="submit a program with its folder, a Python script or a shell command as a job",
        description="Submit a program with its arguments after -- (`-- python train.py --epochs 3`; a first word "
        "ending in .py runs with python), run in a copy of the folder --workdir sends along (its code and small files: "
        "imports and relative paths work as they do here; .gitignore and .trainhubignore are respected, at most "
        "50 MB), or, without --workdir, in your home directory. The older forms still work: SCRIPT alone (one .py "
        "file, sent as the job's source and run as `python script.py` in your home directory) and --command (a shell "
        "command). Prints the job id; with --wait, follows the job until it ends and exits non-zero if it did not "
        "succeed.",
    )
    s.add_argument("program", nargs="*", metavar="SCRIPT | -- CMD [ARG ...]",
                   help="a Python file to run as the job, or after -- a command and its arguments")
    s.add_argument("--command", "-c", dest="shell_command", metavar="CMD", help="a shell command to run instead")
    add_workdir_options(s)
    add_spec_options(s)
    s.add_argument("--wait", action="store_true", help="follow the job until it ends (a live status line)")
    s.add_argument("--json", action="store_true", help="print the created job as JSON")
    _conn(s)
    s.set_defaults(func=cmd_submit)

    ls = jobs.add_parser("list", help="list jobs, newest first",
                         description="List jobs, newest first. Without --all only your own jobs are shown.")
    ls.add_argument("--state", action="append", default=[], metavar="STATE",
                    help=f"only jobs in STATE (repeatable or comma-separated: {', '.join(JOB_STATES)})")
    ls.add_argument("--all", action="store_true", help="everyone's jobs (admins; others only ever see their own)")
    ls.add_argument("--user", metavar="NAME", help="only NAME's jobs (admins)")
    ls.add_argument("--limit", type=int, default=50, metavar="N", help="at most N jobs (default 50)")
    ls.add_argument("--offset", type=int, default=0, metavar="N", help="skip the N newest (paging)")
    ls.add_argument("--kind", choices=["notebook"], help="only jobs of this kind (notebook: JupyterLab's notebook jobs)")
    ls.add_argument("--before", metavar="ID", help="only jobs older than ID (paging: the last ID of the previous page)")
    ls.add_argument("--json", action="store_true", help="machine-readable output (the API's page object)")
    _conn(ls)
    ls.set_defaults(func=cmd_list)

    sh = jobs.add_parser("show", help="show one job",
                         description="Show one job: state, reason, GPUs, times, exit codes, and what happened to it (its events: "
                         "starts, retries, preemptions, \"resumed from step S\").")
    sh.add_argument("id", metavar="ID", help="job id, e.g. j-000042")
    sh.add_argument("--json", action="store_true", help="the job object as JSON")
    _conn(sh)
    sh.set_defaults(func=cmd_show)

    wy = jobs.add_parser("why", help="why a job waits, or what holds a running job back",
                         description="A queued job: why it waits (quota, free GPUs, priority). A running or finished "
                         "job: the GPU efficiency advisor's diagnoses (input-bound, stalled, memory-bound, straggler) "
                         "with the measurements they were drawn from and the remedies that apply.")
    wy.add_argument("id", metavar="ID", help="job id, e.g. j-000042")
    wy.add_argument("--json", action="store_true", help="the API's answers as JSON ({'why': ..., 'diagnosis': ...})")
    _conn(wy)
    wy.set_defaults(func=cmd_why)

    lg = jobs.add_parser("logs", help="print a job's logs",
                         description="Print a job's logs: lines '<time> [<worker rank>] <text>'. "
                         "With --follow, keep printing until the job ends.")
    lg.add_argument("id", metavar="ID", help="job id")
    lg.add_argument("--follow", "-f", action="store_true", help="stream new lines until the job ends")
    lg.add_argument("--worker", type=int, metavar="N", help="only worker rank N")
    lg.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    _conn(lg)
    lg.set_defaults(func=cmd_logs)

    c = jobs.add_parser("cancel", help="cancel a job", description="Cancel a job: its workers get SIGTERM, then "
                        "SIGKILL after the grace period. Cancelling a finished job changes nothing.")
    c.add_argument("id", metavar="ID", nargs="+", help="one or more job ids")
    _conn(c)
    c.set_defaults(func=cmd_cancel)

    m = jobs.add_parser("metrics", help="print a job's reported metrics",
                        description="Print the metrics a job reported with trainhub.log_metrics(): one row per "
                        "(step, worker), one column per metric; --json adds GPU utilisation samples.")
    m.add_argument("id", metavar="ID", help="job id")
    m.add_argument("--json", action="store_true", help="the API's metrics object as JSON")
    _conn(m)
    m.set_defaults(func=cmd_metrics)

    tb = jobs.add_parser("tensorboard", help="show jobs' TensorBoard event files side by side",
                         description="Copy the TensorBoard event files of the jobs (written under trainhub.tensorboard_dir() "
                         "in the job) into one folder, one run per job, and run TensorBoard on it until Ctrl-C, copying "
                         "new event files every --refresh seconds. In a platform terminal its address is under your "
                         "server (jupyter-server-proxy); the side panel's TensorBoard button does the same from the browser.")
    tb.add_argument("id", metavar="ID", nargs="+", help="one or more job ids")
    tb.add_argument("--port", type=int, default=0, metavar="N", help="TensorBoard's port on 127.0.0.1 (default: a free one)")
    tb.add_argument("--logdir", metavar="DIR", help="where to gather the event files (default: ~/.cache/trainhub/tensorboard/...)")
    tb.add_argument("--refresh", type=float, default=30.0, metavar="S", help="seconds between copies of new event files")
    _conn(tb)
    tb.set_defaults(func=cmd_tensorboard)


def _conn(p):
    g = p.add_argument_group("connection")
    g.add_argument("--url", metavar="URL", help="jobs API base URL (default: $TRAINHUB_API_URL)")
    g.add_argument("--token", metavar="TOKEN", help="JupyterHub API token (default: $JUPYTERHUB_API_TOKEN)")


# -- helpers ----------------------------------------------------------------------------------
def client_from_args(args):
    from trainhub.client import TrainhubClient, TrainhubConfigError

    try:
        return TrainhubClient(url=args.url, token=args.token)
    except TrainhubConfigError as e:
        raise CommandError(str(e), 2) from None


def _api(call, *a, **kw):
    from trainhub.client import TrainhubAPIError

    try:
        return call(*a, **kw)
    except TrainhubAPIError as e:
        raise CommandError(str(e)) from None
    except ValueError as e:
        raise CommandError(str(e), 2) from None


def check_workdir_args(args) -> None:
    """--exclude only narrows the folder --workdir sends (jobs submit, sweeps create): alone it is a usage error."""
    if args.exclude and not args.workdir:
        raise CommandError("--exclude leaves things out of the folder --workdir sends: give --workdir DIR too", 2)


def send_workdir(client, args, what: str = "") -> str:
    """Upload --workdir DIR (a folder that cannot be sent: exit 2) and say what went; its digest for the spec."""
    sent = _api(client.send_workdir, args.workdir, exclude=args.exclude)
    print(f"working directory {sent['folder']}{what}: {workdir_summary(sent)}", file=sys.stderr)
    return sent["sha256"]


# -- commands ---------------------------------------------------------------------------------
def cmd_submit(args):
    program = list(args.program)
    if bool(program) == bool(args.shell_command):
        raise CommandError("give either SCRIPT (a .py file), -- CMD [ARG ...] or --command 'CMD', not both or neither", 2)
    check_workdir_args(args)
    script = command = None
    named = None  # the file whose name names the job
    if args.shell_command:
        command = args.shell_command
    elif len(program) == 1 and not args.workdir:  # the older form: one file, sent as the job's source
        named = path = Path(program[0])
        if path.suffix != ".py":
            raise CommandError(f"{path} is not a .py file: for other programs use -- {path} [ARG ...] or --command '...'", 2)
        try:
            script = path.read_text()
        except OSError as e:
            raise CommandError(f"cannot read {path}: {e.strerror}", 2) from None
    else:
        if program[0].endswith(".py"):
            program.insert(0, "python")
        named = next((Path(a) for a in program[1:2] if a.endswith(".py")), None)
        command = shlex.join(program)
    spec = spec_from_args(args, command=command, script=script)
    if named is not None and "name" not in spec:
        spec["name"] = re.sub(r"[^A-Za-z0-9._ -]", "-", named.stem)[:128] or "script"
    client = client_from_args(args)
    if args.workdir:
        spec["workdir"] = send_workdir(client, args)
    job = _api(client.submit, spec)
    if args.json and not args.wait:
        print(json.dumps(job, indent=2))
        return 0
    print(f"submitted {job['id']} ({job.get('state', '?')}{': ' + job['reason'] if job.get('reason') else ''})",
          file=sys.stderr if args.json else sys.stdout)
    if not args.wait:
        print(f"follow it with: trainhub jobs logs {job['id']} --follow")
        return 0
    job = wait_with_progress(client, job["id"])
    if args.json:
        print(json.dumps(job, indent=2))
    return 0 if job.get("state") == SUCCEEDED else 1


def wait_with_progress(client, job_id: str, poll: float = 1.0, stream=None) -> dict:
    """Poll until the job ends, showing one live line (state, elapsed, last log line) on a
    terminal, or one line per state change otherwise. Ctrl-C stops waiting, not the job."""
    stream = stream or sys.stderr
    live = stream.isatty()
    last_state = None

    def show(job):
        nonlocal last_state
        state = job.get("state")
        if live:
            try:
                tail = last_log_line(client.logs(job_id, tail=1))
            except Exception:
                tail = ""
            line = f"{job_id} {state:<9} {fmt_duration(elapsed_seconds(job))}  {tail}"
            width = shutil.get_terminal_size((100, 20)).columns - 1
            stream.write("\r" + line[:width].ljust(width))
            stream.flush()
        elif state != last_state:
            reason = f": {job['reason']}" if job.get("reason") and state != RUNNING else ""
            print(f"{job_id} {state}{reason}", file=stream)
        last_state = state

    try:
        job = _api(client.wait, job_id, poll=poll, callback=show)
    except KeyboardInterrupt:
        if live:
            stream.write("\n")
        print(f"stopped waiting; {job_id} keeps running (cancel it with: trainhub jobs cancel {job_id})", file=stream)
        raise
    if live:
        stream.write("\n")
    reason = f" ({job['reason']})" if job.get("reason") else ""
    print(f"{job_id} {job['state']} after {fmt_duration(elapsed_seconds(job))}{reason}", file=stream)
    if job["state"] != SUCCEEDED:
        try:
            tail = client.logs(job_id, tail=10)
        except Exception:
            tail = ""
        if tail.strip():
            print("last log lines:\n" + tail.rstrip(), file=stream)
    return job


def cmd_list(args):
    client = client_from_args(args)
    states = _api(parse_states, args.state, JOB_STATES)
    user = args.user
    if not user and not args.all:
        user = client.whoami()
    page = _api(client.list, state=states or None, user=user, limit=args.limit, offset=args.offset, kind=args.kind,
                before=args.before)
    if args.json:
        print(json.dumps(page, indent=2))
        return 0
    items = page.get("items", [])
    if not items:
        print("no jobs" + (f" in state {', '.join(states)}" if states else ""))
        return 0
    rows = []
    for j in items:
        created = parse_time(j.get("created"))
        rows.append([j["id"], clip(j.get("name"), 24), j.get("user", ""), j.get("state", ""),
                     f"{j.get('gpus', '?')}x{j.get('workers', 1)}", created.strftime("%Y-%m-%d %H:%M") if created else "-",
                     fmt_duration(elapsed_seconds(j)), clip(j.get("reason"), 60)])
    print(text_table(rows, ["ID", "NAME", "USER", "STATE", "GPUSxW", "CREATED", "ELAPSED", "REASON"]))
    total = page.get("total", len(items))
    if args.before and page.get("next_before"):
        print(f"(more with --before {page['next_before']})")
    elif not args.before and total > page.get("offset", 0) + len(items):
        print(f"({len(items)} of {total}; more with --offset {page.get('offset', 0) + len(items)})")
    return 0


def cmd_show(args):
    client = client_from_args(args)
    job = _api(client.get, args.id)
    if args.json:
        print(json.dumps(job, indent=2))
        return 0
    try:
        events = client.events(job["id"])
    except Exception:  # an older service without the events route: the job alone (its attempt without restarts)
        events = None
    print(format_job(job, events))
    if events:
        print("  events:")
        print(format_events(events, indent="    "))
    diagnosis = _diagnosis_or_none(client, job)
    if diagnosis is not None:
        print(format_diagnosis(diagnosis, remedies=False, indent="  "))
    return 0


def _diagnosis_or_none(client, job: dict):
    """The advisor's view of a job that ran, or None (queued, or no advisor on this service)."""
    from trainhub.client import TrainhubAPIError

    if job.get("state") == QUEUED:
        return None
    try:
        return client.diagnosis(job["id"])
    except (TrainhubAPIError, ValueError):
        return None


def cmd_why(args):
    client = client_from_args(args)
    job = _api(client.get, args.id)
    why = _api(client.why, args.id) if job.get("state") == QUEUED else None
    diagnosis = _diagnosis_or_none(client, job)
    if args.json:
        print(json.dumps({"id": job["id"], "state": job.get("state"), "why": why, "diagnosis": diagnosis}, indent=2))
        return 0
    if why is not None:
        print(wait_reason_text(job, why))
        return 0
    print(f"{job['id']} {state_text(job)}")
    if diagnosis is None:
        print("  no GPU efficiency diagnosis available (the usage advisor is not running on this service)")
        return 0
    print(format_diagnosis(diagnosis, remedies=True, indent="  "))
    return 0


def cmd_logs(args):
    client = client_from_args(args)
    if args.follow:
        try:
            for line in _api(lambda: list_or_gen(client.follow_logs(args.id, worker=args.worker, tail=args.tail))):
                print(line, flush=True)
        except KeyboardInterrupt:
            return 130
        return 0
    sys.stdout.write(_api(client.logs, args.id, worker=args.worker, tail=args.tail))
    sys.stdout.flush()
    return 0


def list_or_gen(gen):
    """Start a generator so a request error surfaces inside _api, then yield the rest."""
    from trainhub.client import TrainhubAPIError

    it = iter(gen)
    try:
        first = next(it)
    except StopIteration:
        return iter(())

    def rest():
        yield first
        try:
            yield from it
        except TrainhubAPIError as e:
            raise CommandError(str(e)) from None
    return rest()


def cancel_each(ids, cancel, prog: str) -> int:
    """Cancel every id, printing each outcome; one failure does not stop the others (exit 1 if any failed)."""
    failed = 0
    for item_id in ids:
        try:
            obj = _api(cancel, item_id)
        except CommandError as e:
            print(f"{prog}: {item_id}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{obj['id']}: {obj.get('state')}" + (f" ({obj['reason']})" if obj.get("reason") else ""))
    return 1 if failed else 0


def cmd_cancel(args):
    return cancel_each(args.id, client_from_args(args).cancel, "trainhub jobs cancel")


def cmd_metrics(args):
    client = client_from_args(args)
    data = _api(client.metrics, args.id)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    columns, rows = metrics_rows(data)
    if not rows:
        print(f"{args.id} has reported no metrics (call trainhub.log_metrics(step=..., loss=...) in the job)")
        return 0
    cols = [c for c in columns if c != "time"]
    print(text_table([[fmt_number(r.get(c, "")) for c in cols] for r in rows], [c.upper() if c in ("step", "worker") else c for c in cols]))
    return 0


def cmd_tensorboard(args):
    import hashlib
    import signal
    import socket
    import subprocess

    from trainhub import tensorboard as tb
    from trainhub.exceptions import InvalidRequest
    from trainhub.jobarea import env_storage_options

    reason = tb.installed()
    if reason:
        raise CommandError(reason)
    client = client_from_args(args)
    jobs = [_api(client.get, i) for i in dict.fromkeys(args.id)]
    key = "\0".join(sorted(j["id"] for j in jobs))
    logdir = Path(args.logdir or Path.home() / ".cache" / "trainhub" / "tensorboard" / hashlib.sha256(key.encode()).hexdigest()[:16])

    def gather():
        try:
            return tb.gather(jobs, logdir, env_storage_options())
        except InvalidRequest as e:
            raise CommandError(str(e), 2) from None
        except OSError as e:
            raise CommandError(f"cannot read the jobs' event files from storage: {e}") from None

    got = gather()
    for job_id in got.empty:
        print(f"{job_id} has no TensorBoard event files (yet): write them under trainhub.tensorboard_dir()", file=sys.stderr)
    port = args.port
    if not port:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    server = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    prefix = tb.proxy_prefix(server, port) if server else ""
    proc = subprocess.Popen(tb.command(logdir, port, prefix), stdin=subprocess.DEVNULL)
    # a SIGTERM (kill, a closing terminal's supervisor) stops TensorBoard too, as Ctrl-C does: by default it would end
    # this process at once and leave the server running, holding its port
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    where = f"{prefix}/ (under this hub's address)" if server else f"http://127.0.0.1:{port}/"
    print(f"TensorBoard for {', '.join(j['id'] for j in jobs)} ({got.files} event files): {where}  [Ctrl-C to stop]",
          flush=True)
    try:
        while proc.poll() is None:
            try:
                proc.wait(args.refresh)
            except subprocess.TimeoutExpired:
                jobs[:] = [_api(client.get, j["id"]) for j in jobs]
                gather()
    except KeyboardInterrupt:
        pass
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
    return 0
