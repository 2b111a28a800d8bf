"""``@trainhub.remote``: run a Python function as a trainhub job and get its value back.

::

    import trainhub

    @trainhub.remote(gpus=1, workers=2, time_limit="2h")
    def train(lr, epochs=3):
        ...                       # runs on every worker (RANK 0..1), as a %%train cell would
        return model.state_dict()  # rank 0's value comes back

    state = train(0.1)            # submit, wait, return the value (tensors on the CPU)
    call = train.submit(0.1)      # or: a handle now (trainhub.handle.RemoteCall), the value later
    state = call.result()
    train.local(0.1)              # the plain function, here

The job's script is made by :func:`trainhub.capture.build_function_script`, the capture ``%%train``
uses: the function's source and what it uses (functions and classes of its module, modules as
imports, other globals pickled), or an import by name for functions of installed packages; the
arguments are pickled. The value comes back through the job's storage area
(:mod:`trainhub.results`). Works from notebooks, scripts and libraries: anywhere
``$TRAINHUB_API_URL`` and a token are set (or a client is given) and the job's storage area can
be read (``$TRAINHUB_STORAGE_OPTIONS``: platform notebooks and jobs).
"""

from __future__ import annotations

import functools
import sys
import warnings

from trainhub.capture import DEFAULT_MAX_VALUE_BYTES, CaptureError, build_function_script
from trainhub.handle import RemoteCall

__all__ = ["remote", "RemoteFunction", "CaptureError"]

_SPEC_OPTIONS = ("gpus", "workers", "profile", "time_limit", "retries", "priority", "preemptible")


class RemoteFunction:
    """A function that runs as a job when called. ``fn(...)`` = ``fn.submit(...).result()``;
    ``fn.local(...)`` runs it here; ``fn.options(gpus=2)`` is a copy with other resources."""

    def __init__(self, fn, *, name: str | None = None, env: dict | None = None, client=None,
                 max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES, poll: float = 1.0, **spec):
        unknown = set(spec) - set(_SPEC_OPTIONS)
        if unknown:
            raise TypeError(f"@trainhub.remote got unknown option(s) {sorted(unknown)}; it takes "
                            f"{', '.join(('name', 'env', 'client', 'max_value_bytes', 'poll') + _SPEC_OPTIONS)}")
        functools.update_wrapper(self, fn)
        self.__trainhub_function__ = fn
        self.name = name or f"remote-{fn.__name__}"[:128]
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.spec = {k: v for k, v in spec.items() if v is not None}
        self.client = client
        self.max_value_bytes = max_value_bytes
        self.poll = poll

    def options(self, **overrides) -> "RemoteFunction":
        """A copy with other options (``fn.options(gpus=2, workers=4)(...)``)."""
        kw = dict(name=self.name, env=self.env, client=self.client, max_value_bytes=self.max_value_bytes,
                  poll=self.poll, **self.spec)
        kw.update(overrides)
        return RemoteFunction(self.__trainhub_function__, **kw)

    def _client(self):
        if self.client is None:
            from trainhub.client import TrainhubClient

            self.client = TrainhubClient()
        return self.client

    def job_spec(self, *args, **kwargs) -> dict:
        """The job spec a call with these arguments submits (the script included)."""
        history, transform = _notebook_history()
        script = build_function_script(self.__trainhub_function__, args, kwargs, max_value_bytes=self.max_value_bytes,
                                       history=history, transform=transform)
        if script.left_out:
            raise CaptureError(
                f"{self.__name__}() uses values that cannot be sent with the job, so nothing was submitted:\n"
                + "\n".join(f"  - {n}: {why}" for n, why in sorted(script.left_out.items()))
                + "\nPass data through storage instead (a path under $TRAINHUB_STORAGE_URL), build it inside the "
                "function, or raise the limit with @trainhub.remote(max_value_bytes=N).")
        if script.undefined:
            warnings.warn(f"{self.__name__}() uses names that are not defined ({', '.join(script.undefined)}): the job "
                          "fails with NameError if it reaches them", stacklevel=3)
        spec = {"script": script.source, "name": self.name, **self.spec}
        if self.env:
            spec["env"] = dict(self.env)
        return spec

    def submit(self, *args, **kwargs) -> RemoteCall:
        """Submit a call as a job now; returns its handle (``.result()`` waits and gives the value)."""
        job = self._client().submit(self.job_spec(*args, **kwargs))
        return RemoteCall(self._client(), job, self.__name__)

    def __call__(self, *args, **kwargs):
        """Run as a job, wait for it, return the function's value (rank 0's). Raises
        ``trainhub.handle.JobFailedError`` (with the log tail: the traceback) when it failed."""
        return self.submit(*args, **kwargs).result(poll=self.poll)

    def local(self, *args, **kwargs):
        """Call the plain function in this process."""
        return self.__trainhub_function__(*args, **kwargs)

    def __repr__(self):
        opts = ", ".join(f"{k}={v!r}" for k, v in self.spec.items())
        return f"<trainhub.remote {self.__module__}.{self.__qualname__}({opts})>"


def _notebook_history():
    """In an IPython kernel: the cells run so far and its cell transformer (for definitions ``inspect``
    cannot find, such as classes defined in cells); elsewhere (None, None)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None:
        return None, None
    return list(shell.history_manager.input_hist_raw), shell.transform_cell


def remote(fn=None, /, **options):
    """Decorator: ``@trainhub.remote`` or ``@trainhub.remote(gpus=1, workers=2, time_limit="1h", ...)``.

    Options: ``gpus`` (per worker), ``workers``, ``profile``, ``time_limit`` (seconds or "90s", "2h"),
    ``retries``, ``priority``, ``preemptible``, ``name`` (the job's), ``env`` ({K: V}), ``client``
    (a ``TrainhubClient``; default from ``$TRAINHUB_API_URL``/``$JUPYTERHUB_API_TOKEN``),
    ``max_value_bytes`` (largest pickled global or argument list sent with the job; default 1 MB),
    ``poll`` (seconds between status checks while waiting).
    """
    if fn is not None:
        if not callable(fn):
            raise TypeError(f"@trainhub.remote decorates a function, not {type(fn).__name__}; options are keywords: "
                            "@trainhub.remote(gpus=1)")
        return RemoteFunction(fn, **options)
    return lambda f: RemoteFunction(f, **options)
