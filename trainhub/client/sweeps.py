"""The sweeps API (docs/sweeps.md): start, list, inspect, wait for and cancel hyperparameter sweeps."""

from __future__ import annotations

from typing import Callable

from trainhub.states import sweep_is_terminal

from .base import ClientBase, check_ref, page_params


def _sweep(sweep_id) -> str:
    return check_ref(sweep_id, "sweep id")


class SweepsAPI(ClientBase):
    def create_sweep(self, spec: dict) -> dict:
        """POST /sweeps: a job spec (``script`` or ``command``, ``gpus``...) plus ``trials``, ``parallel``,
        ``metric``, ``mode``, ``space`` ({name: "loguniform:1e-5:1e-1", ...}), ``sampler``, ``pruner``.
        Returns the sweep; bad input raises :class:`TrainhubAPIError` (400) and nothing is submitted."""
        return self._json("POST", "/sweeps", json={k: v for k, v in spec.items() if v is not None})

    def list_sweeps(self, state=None, *, user: str | None = None, limit: int = 50, offset: int = 0) -> dict:
        """GET /sweeps: ``{"items": [...], "total", "limit", "offset"}``, newest first."""
        return self._json("GET", "/sweeps", params=page_params(state, user=user, limit=limit, offset=offset))

    def get_sweep(self, sweep_id: str) -> dict:
        """GET /sweeps/{id}: state, progress, best trial, parameter importance."""
        return self._json("GET", f"/sweeps/{_sweep(sweep_id)}")

    def sweep_trials(self, sweep_id: str) -> list[dict]:
        """GET /sweeps/{id}/trials: the trials (number, state, params, value, intermediate, job_id...)."""
        return self._json("GET", f"/sweeps/{_sweep(sweep_id)}/trials")["items"]

    def cancel_sweep(self, sweep_id: str) -> dict:
        """DELETE /sweeps/{id}: no new trials; running trials' jobs are cancelled. Returns the sweep."""
        return self._json("DELETE", f"/sweeps/{_sweep(sweep_id)}")

    def wait_sweep(self, sweep_id: str, poll: float = 1.0, callback: Callable[[dict], None] | None = None,
                   timeout: float | None = None) -> dict:
        """Poll until the sweep is completed, failed or cancelled and return it (``callback(sweep)`` after
        every poll; ``timeout`` seconds raises TimeoutError)."""
        return self._wait_until_terminal(lambda: self.get_sweep(sweep_id), sweep_is_terminal, f"sweep {sweep_id} to end",
                                         poll_interval=poll, callback=callback, timeout=timeout)
