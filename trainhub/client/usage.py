"""Usage accounting and the GPU efficiency advisor (trainhub.services.usage, docs/usage.md)."""

from __future__ import annotations

from .base import ClientBase, check_ref


class UsageAPI(ClientBase):
    def usage(self, *, since: str | None = None, until: str | None = None, by: str = "user",
              user: str | None = None) -> dict:
        """GET /usage: GPU-seconds allocated / used ``by`` user, group, profile, day, kind or holder
        (``{"items": [...], "totals": {...}, ...}``); users get only their own figures."""
        params = {k: v for k, v in (("since", since), ("until", until), ("by", by), ("user", user)) if v}
        return self._json("GET", "/usage", params=params)

    def usage_csv(self, *, since: str | None = None, until: str | None = None, by: str = "user",
                  user: str | None = None) -> str:
        """GET /usage?format=csv: the report's items as CSV text."""
        params = {k: v for k, v in (("since", since), ("until", until), ("by", by), ("user", user)) if v}
        params["format"] = "csv"
        return self.request("GET", "/usage", params=params).text

    def usage_metrics(self) -> str:
        """GET /usage/metrics: Prometheus text of everyone's usage (admins)."""
        return self.request("GET", "/usage/metrics").text

    def diagnosis(self, job_id: str) -> dict:
        """GET /jobs/{id}/diagnosis: the advisor's diagnoses of a job, with their measurements."""
        return self._json("GET", f"/jobs/{check_ref(job_id, 'job id')}/diagnosis")
