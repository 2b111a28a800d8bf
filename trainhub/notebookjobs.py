"""Whole notebooks as trainhub jobs: the vocabulary the JupyterLab "Create Notebook Job" back end
(``trainhub.extensions.notebookjobs``, in the user's server) and the jobs service's schedules
(``trainhub.services.notebooks``) share.

- :func:`load_notebook`: the notebook's text as an ``nbformat`` node, or a :class:`NotebookJobError`
  saying why it does not parse.
- :func:`declared_parameters` / :func:`coerce_parameters`: papermill's convention (the first cell tagged
  ``parameters``); a value for a name that cell does not assign is refused, values given as text
  (jupyter-scheduler's form sends strings) take the type of the declared default.
- :func:`job_spec`: the ``POST /jobs`` spec of a notebook job. Its ``script`` carries a frozen copy of
  the notebook (taken when the job or the schedule is made, as jupyter-scheduler stages its input) and
  runs papermill on it **inside the job, as the user**: the executed notebook is written next to the
  input (``<stem>-<job id>.ipynb``, saved after every cell, plus ``.html`` when asked; worker N > 0 of a job with
  several writes ``<stem>-<job id>-worker<N>.ipynb``), and the notebook
  runs in the input's folder, so the files it writes land there too. Nothing is written by a process of
  the platform's. ``$TRAINHUB_NOTEBOOK`` (JSON: input, parameters, output formats, schedule) says what
  the job is, for the lists.
- A notebook in the user's **storage area** (``storage_path``: where a Kubernetes job pod, which never sees the
  notebook server's home, can reach it): the job runs papermill in a scratch folder of its own and puts the executed
  notebook and every file the run wrote there into the input's folder of the storage area (``$TRAINHUB_STORAGE_URL``,
  fsspec, the job's own credentials), the executed notebook also every ``UPLOAD_EVERY`` seconds while it runs. The
  server shows that folder through its storage mount, so the outputs appear next to the input there too.
- :func:`check_schedule` / :func:`due_times`: cron expressions through croniter.

Standard library, nbformat, papermill (lazily) and croniter only.
"""

from __future__ import annotations

import ast
import json
import posixpath
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from trainhub.exceptions import InvalidRequest

ENV = "TRAINHUB_NOTEBOOK"
OUTPUT_FORMATS = ("ipynb", "html")
MAX_SCRIPT_BYTES = 5 * 1024 * 1024  # the jobs API's limit of a script


class NotebookJobError(InvalidRequest):
    """A notebook job or schedule that cannot be made (400): the message says what to change."""


def load_notebook(text: str | bytes, path: str = "the notebook"):
    """The notebook node of ``text`` (nbformat 4), or :class:`NotebookJobError` naming what is wrong."""
    import nbformat

    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception as e:  # JSON errors, schema errors, unknown versions
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NotebookJobError(f"{path} is not a notebook Jupyter can read: {first[:300]}") from None
    return nb


def declared_parameters(nb) -> dict[str, str]:
    """Name -> the kind of its default ("int", "float", "str", "bool", "list", ... or "" when the default is
    an expression) of what the first cell tagged ``parameters`` assigns (papermill's reading of the cell,
    an annotation such as ``lr: float = 0.1`` winning); empty without such a cell."""
    from papermill.inspection import _infer_parameters

    _tag_lists(nb)
    out = {}
    for p in _infer_parameters(nb, name="python3", language="python"):
        kind = p.inferred_type_name if p.inferred_type_name not in (None, "None") else ""
        if not kind:
            try:
                kind = type(ast.literal_eval(p.default)).__name__
            except (ValueError, SyntaxError, TypeError):
                kind = ""
        out[p.name] = kind
    return out


def _tag_lists(nb) -> None:
    """papermill reads ``cell.metadata.tags`` of every cell (its own loader adds the empty lists)."""
    for cell in nb.cells:
        cell.metadata.setdefault("tags", [])


def coerce_parameters(nb, given: dict | None, path: str = "the notebook") -> dict:
    """The values to inject: each name must be declared in the ``parameters`` cell; a text value for a
    declared non-text default is read as a Python literal ("0.5" -> 0.5, "True" -> True)."""
    given = dict(given or {})
    if not given:
        return {}
    declared = declared_parameters(nb)
    if not declared:
        raise NotebookJobError(
            f"{path} has no cell tagged 'parameters', so it takes no parameters (given: {', '.join(sorted(given))}); "
            "tag the cell that assigns them 'parameters' (papermill's convention)")
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise NotebookJobError(
            f"{path} does not declare the parameter(s) {', '.join(unknown)} in its 'parameters' cell "
            f"(it declares: {', '.join(sorted(declared))})")
    out = {}
    for name, value in given.items():
        kind = (declared[name] or "").lower()
        if isinstance(value, str) and kind not in ("str", "string"):
            try:
                value = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                if kind in ("int", "float", "bool"):
                    raise NotebookJobError(f"parameter {name} must be a {kind} like its default, not {value[:80]!r}") from None
            if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            elif kind in ("int", "float", "bool") and type(value).__name__ != kind:
                raise NotebookJobError(f"parameter {name} must be a {kind} like its default, not {value!r}")
        out[name] = value
    return out


def output_path(input_path: str, job_id: str, fmt: str = "ipynb") -> str:
    """Where the executed notebook of job ``job_id`` is written: next to the input (home-relative)."""
    folder, name = posixpath.split(input_path)
    stem = name[:-6] if name.endswith(".ipynb") else name
    return posixpath.join(folder, f"{stem}-{job_id}.{fmt}")


def check_input_path(path: str) -> str:
    """A notebook path relative to the user's home: no absolute paths, no ``..``."""
    p = posixpath.normpath(str(path or "").strip())
    if not p or p in (".",) or p.startswith("/") or p == ".." or p.startswith("../") or "\x00" in p:
        raise NotebookJobError(f"the notebook path {path!r} must be a path inside your home folder")
    if not p.endswith(".ipynb"):
        raise NotebookJobError(f"{p} is not a notebook (.ipynb)")
    return p


# The job's script: runs as the user in the job's sandbox, in the input's folder of the home; or, for an input in the
# storage area ("storage" in $TRAINHUB_NOTEBOOK), in a scratch folder whose files are put next to the input there.
RUNNER = r'''"""trainhub notebook job: papermill on a copy of {input} (made when the job was created)."""
import json, os, sys, threading
import nbformat, papermill

info = json.loads(os.environ["TRAINHUB_NOTEBOOK"])
nb = nbformat.reads(NOTEBOOK, as_version=4)
area = info.get("storage")  # the input's path in the user's storage area: the outputs go there
home = os.path.expanduser("~")
if area:
    if not os.environ.get("TRAINHUB_STORAGE_URL"):
        print("trainhub: this notebook is in your storage area, but the job has no $TRAINHUB_STORAGE_URL to put its "
              "outputs there (the platform has no storage configured)", file=sys.stderr, flush=True)
        sys.exit(1)
    import fsspec
    fs, root = fsspec.core.url_to_fs(os.environ["TRAINHUB_STORAGE_URL"],
                                     **json.loads(os.environ.get("TRAINHUB_STORAGE_OPTIONS") or "{{}}"))
    dest = root.rstrip("/") + "/" + os.path.dirname(area) if os.path.dirname(area) else root.rstrip("/")
    home = os.path.join(os.environ.get("TRAINHUB_JOB_DIR") or os.getcwd(), "notebook")  # the scratch folder
    if not os.access(os.path.expanduser("~"), os.W_OK):
        os.environ.setdefault("JUPYTER_RUNTIME_DIR", os.path.join(home, ".jupyter-runtime"))
src = os.path.join(home, info["input"])
folder = os.path.dirname(src)
os.makedirs(folder, exist_ok=True)
job = os.environ.get("TRAINHUB_JOB_ID", "local")
rank = int(os.environ.get("RANK") or 0)  # each worker of a job with several runs the notebook: one output each
stem = os.path.basename(src)[:-6] if src.endswith(".ipynb") else os.path.basename(src)
out = os.path.join(folder, f"{{stem}}-{{job}}.ipynb" if rank == 0 else f"{{stem}}-{{job}}-worker{{rank}}.ipynb")
shown = os.path.join(os.path.dirname(info["input"]), os.path.basename(out))


def put(paths):
    """Copy files of the scratch folder to the input's folder of the storage area (same relative paths)."""
    for p in paths:
        target = dest + "/" + os.path.relpath(p, folder).replace(os.sep, "/")
        if "file" in fs.protocol or "local" in fs.protocol:
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(p, target)


def keep_putting(stop):
    """The executed notebook (saved after every cell) to storage every UPLOAD_EVERY s while it changes."""
    seen = None
    while not stop.wait(UPLOAD_EVERY):
        try:
            mtime = os.stat(out).st_mtime_ns
            if mtime != seen:
                put([out])
                seen = mtime
        except Exception as e:  # a failed copy is retried at the next tick and at the end
            print(f"trainhub: copying {{shown}} to storage failed for now: {{e}}", file=sys.stderr, flush=True)


print(f"running {{info['input']}} with parameters {{json.dumps(info.get('parameters') or {{}})}} -> {{shown}}", flush=True)
stop = threading.Event()
if area:
    threading.Thread(target=keep_putting, args=(stop,), daemon=True).start()
failed = crashed = None
try:
    papermill.execute_notebook(nb, out, parameters=info.get("parameters") or {{}}, kernel_name=KERNEL, language="python",
                               cwd=folder, progress_bar=False, log_output=True)
except papermill.PapermillExecutionError as e:
    failed = e
except BaseException as e:  # the kernel died, a signal: what ran is still put in storage, then it is raised
    crashed = e
finally:
    stop.set()
if crashed is None and "html" in (info.get("output_formats") or []) and os.path.exists(out):
    import nbconvert
    body, _ = nbconvert.HTMLExporter().from_filename(out)
    with open(out[:-6] + ".html", "w", encoding="utf-8") as f:
        f.write(body)
if area:
    made = [os.path.join(d, n) for d, dirs, names in os.walk(folder) for n in names
            if not os.path.relpath(os.path.join(d, n), folder).startswith((".jupyter-runtime", ".ipynb_checkpoints"))]
    put(made)
    print(f"trainhub: {{len(made)}} file(s) put next to the input in your storage area: "
          f"{{', '.join(sorted(os.path.relpath(p, folder) for p in made))}}", flush=True)
if crashed is not None:
    raise crashed
if failed is not None:
    print(f"the notebook failed in cell {{failed.exec_count}}: {{failed.ename}}: {{failed.evalue}}", file=sys.stderr, flush=True)
    sys.exit(1)
print(f"done: {{shown}}", flush=True)
'''

UPLOAD_EVERY = 10.0  # seconds between copies of a running notebook job's executed notebook to the storage area


def job_spec(nb, input_path: str, *, parameters: dict | None = None, profile: str | None = None,
             workers: int | None = None, gpus: int | None = None, time_limit=None, name: str | None = None,
             output_formats=None, path_label: str | None = None, storage_path: str | None = None) -> dict:
    """The ``POST /jobs`` spec running notebook ``nb`` (already read) for the input ``input_path`` (home-relative).

    ``storage_path``: the same input's path in the user's storage area when it lies there (the server sees the area
    through its storage mount): the job then puts its outputs there, where a job on any back end can reach them."""
    import nbformat

    input_path = check_input_path(input_path)
    if storage_path is not None:
        storage_path = check_input_path(storage_path)
    label = path_label or input_path
    values = coerce_parameters(nb, parameters, label)
    formats = [f for f in (output_formats or ["ipynb"]) if f]
    bad = [f for f in formats if f not in OUTPUT_FORMATS]
    if bad:
        raise NotebookJobError(f"output format(s) {', '.join(bad)} are not offered; choose from {', '.join(OUTPUT_FORMATS)}")
    _tag_lists(nb)
    kernel = (nb.metadata.get("kernelspec") or {}).get("name") or "python3"
    text = nbformat.writes(nb)
    script = f"NOTEBOOK = {text!r}\nKERNEL = {kernel!r}\nUPLOAD_EVERY = {UPLOAD_EVERY!r}\n" + RUNNER.format(input=input_path)
    if len(script.encode()) > MAX_SCRIPT_BYTES:
        raise NotebookJobError(f"{label} is too big to run as a job ({len(script.encode()) // 1024} KiB with its outputs; "
                               "the limit is 5 MiB): clear its outputs and try again")
    info = {"input": input_path, "parameters": values, "output_formats": formats}
    if storage_path is not None:
        info["storage"] = storage_path
    env_value = json.dumps(info, separators=(",", ":"))
    if len(env_value) > 2048:
        raise NotebookJobError("the parameters are too long (at most about 2,000 characters in all); pass large values through storage")
    spec = {"name": name or posixpath.basename(input_path)[:-6], "script": script, "env": {ENV: env_value}}
    if profile:
        spec["profile"] = profile
    if workers is not None:
        spec["workers"] = workers
    if gpus is not None:
        spec["gpus"] = gpus
    if time_limit not in (None, ""):
        spec["time_limit"] = time_limit
    return spec


def notebook_info(job: dict) -> dict | None:
    """What ``$TRAINHUB_NOTEBOOK`` of a job object says, or None for a job that is not a notebook job."""
    raw = (job.get("env") or {}).get(ENV)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    return info if isinstance(info, dict) and isinstance(info.get("input"), str) else None


# -- schedules ----------------------------------------------------------------------------------------
def _zone(tz: str | None):
    if not tz or tz.upper() == "UTC":
        return timezone.utc
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise NotebookJobError(f"unknown time zone {tz!r}: use a name like 'UTC' or 'Europe/Berlin'") from None


def check_schedule(expr: str, tz: str | None = None) -> str:
    """A five-field cron expression croniter accepts (``*/15 * * * *``, ``0 3 * * mon-fri``), or a
    :class:`NotebookJobError` naming it."""
    from croniter import croniter

    expr = " ".join(str(expr or "").split())
    _zone(tz)
    if len(expr.split()) != 5 or not croniter.is_valid(expr):
        raise NotebookJobError(
            f"the schedule {expr!r} is not a cron expression: give five fields, minute hour day-of-month month "
            "day-of-week, e.g. '0 3 * * *' (every day at 03:00) or '*/15 * * * *'")
    return expr


def due_times(expr: str, tz: str | None, after: datetime, until: datetime, cap: int = 1000) -> list[datetime]:
    """The times (UTC) the schedule names in ``(after, until]``: the first ``cap - 1`` of them and the latest, so a
    long outage (or a clock moved far) costs at most ``cap`` steps; ``len(...) == cap`` means "at least that many"."""
    from croniter import croniter

    zone = _zone(tz)
    it = croniter(expr, after.astimezone(zone))
    out: list[datetime] = []
    while len(out) < cap - 1:
        t = it.get_next(datetime)
        if t > until:
            return out
        out.append(t.astimezone(timezone.utc))
    latest = croniter(expr, until.astimezone(zone) + timedelta(seconds=1)).get_prev(datetime).astimezone(timezone.utc)
    if not out or latest > out[-1]:
        out.append(latest)
    return out


def next_time(expr: str, tz: str | None, after: datetime) -> datetime:
    from croniter import croniter

    return croniter(expr, after.astimezone(_zone(tz))).get_next(datetime).astimezone(timezone.utc)
