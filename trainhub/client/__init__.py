"""A small synchronous client for the trainhub API (docs/jobs-api.md, docs/sweeps.md, docs/storage.md, docs/usage.md).

Used by the CLI (`trainhub jobs ...`), the ``%%train`` magics and user code::

    from trainhub.client import TrainhubClient
    c = TrainhubClient()                       # $TRAINHUB_API_URL + $JUPYTERHUB_API_TOKEN
    job = c.submit({"command": "python train.py", "gpus": 1})
    job = c.wait(job["id"], callback=lambda j: print(j["state"]))

Blocking (requests): callers that must not block an event loop run it in a thread.
Connection failures are retried a few times with a short backoff; a POST is retried only
when the connection could not be opened, so a job is never submitted twice. Each API area is
a mixin in its own module (:mod:`.jobs`, :mod:`.sweeps`, :mod:`.registry`, :mod:`.usage`) over
the plumbing in :mod:`.base`.
"""

from __future__ import annotations

from .base import ENV_TOKEN, ENV_URL, TrainhubAPIError, TrainhubConfigError
from .jobs import JobsAPI
from .notebooks import NotebooksAPI
from .registry import DatasetVersion, RegistryAPI
from .sweeps import SweepsAPI
from .usage import UsageAPI

__all__ = ["ENV_TOKEN", "ENV_URL", "DatasetVersion", "TrainhubAPIError", "TrainhubClient", "TrainhubConfigError"]


class TrainhubClient(JobsAPI, SweepsAPI, RegistryAPI, UsageAPI, NotebooksAPI):
    """Client for ``$TRAINHUB_API_URL`` authenticated with a JupyterHub API token.

    ``url``/``token`` default to ``$TRAINHUB_API_URL`` / ``$JUPYTERHUB_API_TOKEN`` (set in
    platform notebooks and terminals). ``timeout`` is per request in seconds; ``retries`` is how
    many times a connection failure is retried (0 = never), waiting ``backoff``, 2x, 4x... seconds.
    Jobs: ``submit``, ``list``, ``get``, ``cancel``, ``logs``, ``follow_logs``, ``metrics``, ``why``,
    ``wait``; sweeps: ``create_sweep``, ``list_sweeps``, ``get_sweep``, ``sweep_trials``,
    ``cancel_sweep``, ``wait_sweep``; registries: ``list_datasets``, ``get_dataset``, ``dataset``,
    ``register_dataset``, ``deprecate_dataset``, ``list_models``, ``get_model``, ``model_version``,
    ``register_model``, ``set_model_stage``, ``export_model``; usage: ``usage``, ``usage_csv``,
    ``usage_metrics``, ``diagnosis``; notebook schedules: ``profiles``, ``list_schedules``, ``create_schedule``,
    ``get_schedule``, ``change_schedule``, ``delete_schedule``, ``run_schedule``; ``whoami``.
    """
