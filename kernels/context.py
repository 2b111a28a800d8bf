"""Notebook context for ``%%train``: the kernel side's view of :mod:`trainhub.capture`.

The capture itself (which imports, definitions and values a cell needs, the job script) lives in
the core module :mod:`trainhub.capture`, shared with ``@trainhub.remote``; this module re-exports
it for the magics and adds the notebook's own message for values that cannot be sent.
"""

from __future__ import annotations

from trainhub.capture import (  # noqa: F401  (the kernel side's names for the shared capture)
    BUILTIN_NAMES, DEFAULT_MAX_VALUE_BYTES, IPYTHON_NAMES, CellSyntaxError, Definition, JobScript, build_job_script,
    check_returns, collect_definitions, free_names, parse_cell, pickle_value, strip_magics,
)
from trainhub.fmt import fmt_size


def left_out_message(script: JobScript, max_value_bytes: int) -> str:
    """The message shown when values could not be carried into the job."""
    lines = ["%%train: these variables are used by the cell but cannot be sent with the job, so it was not submitted:"]
    for name, why in sorted(script.left_out.items()):
        lines.append(f"  - {name}: {why}")
    lines += [
        "Pass data through storage instead: save it from the notebook under $TRAINHUB_STORAGE_URL (your storage,",
        "visible to jobs) and read that path in the cell, e.g.",
        "    url = os.environ['TRAINHUB_STORAGE_URL'] + '/data/x.npy'",
        "    with fsspec.open(url, 'wb') as f: np.save(f, x)     # in the notebook",
        "    with fsspec.open(url, 'rb') as f: x = np.load(f)    # in the %%train cell",
        "(with S3 storage pass **json.loads(os.environ['TRAINHUB_STORAGE_OPTIONS']) to fsspec.open: docs/notebooks.md),",
        "or build the value inside the cell. Values up to "
        f"{fmt_size(max_value_bytes)} are sent pickled (raise it with %config TrainMagics.max_value_bytes = N);",
        "pass --ignore-missing to submit anyway (the job fails with NameError if it uses them).",
    ]
    return "\n".join(lines)
