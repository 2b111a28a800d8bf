"""Profiles and notebook schedules (docs/notebook-jobs.md): the mixin of :class:`trainhub.client.TrainhubClient`."""

from __future__ import annotations

from .base import ClientBase, check_ref


def _schedule(sid) -> str:
    return check_ref(sid, "schedule id")


class NotebooksAPI(ClientBase):
    def profiles(self) -> dict:
        """GET /profiles: ``{"items": [{"slug", "display_name", "description", "gpus"}], "default"}``, the caller's."""
        return self._json("GET", "/profiles")

    def list_schedules(self, *, user: str | None = None) -> dict:
        """GET /notebook-schedules: ``{"items": [...], "total"}``."""
        return self._json("GET", "/notebook-schedules", params={"user": user} if user else None)

    def create_schedule(self, body: dict) -> dict:
        """POST /notebook-schedules: ``{"name", "schedule", "timezone", "job": <job spec>, "notebook": {...}}``."""
        return self._json("POST", "/notebook-schedules", json=body)

    def get_schedule(self, sid: str) -> dict:
        return self._json("GET", f"/notebook-schedules/{_schedule(sid)}")

    def change_schedule(self, sid: str, changes: dict) -> dict:
        return self._json("PATCH", f"/notebook-schedules/{_schedule(sid)}", json=changes)

    def delete_schedule(self, sid: str) -> None:
        self.request("DELETE", f"/notebook-schedules/{_schedule(sid)}")

    def run_schedule(self, sid: str) -> dict:
        """POST /notebook-schedules/{id}/runs: one run now; returns the job."""
        return self._json("POST", f"/notebook-schedules/{_schedule(sid)}/runs")
