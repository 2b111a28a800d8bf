"""Handlers of the TensorBoard hand-off (see the package docstring for the routes)."""

from __future__ import annotations

import asyncio
import re

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from trainhub.exceptions import InvalidRequest, NotFound, TrainhubError
from trainhub.httpapi import JSONErrors, parse_json

from .manager import TensorBoards

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class TensorBoardHandler(JSONErrors, APIHandler):
    auth_resource = "trainhub"
    internal_error_message = "internal error in the TensorBoard hand-off; details are in the server log"

    @property
    def boards(self) -> TensorBoards:
        return self.settings["trainhub_tensorboards"]

    def job_ids(self, ids) -> list[str]:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise InvalidRequest('"jobs" must be a list of job ids, e.g. {"jobs": ["j-000042"]}')
        ids = list(dict.fromkeys(i.strip() for i in ids if i.strip()))
        if len(ids) > self.boards.max_jobs:
            raise InvalidRequest(f"at most {self.boards.max_jobs} jobs side by side in one TensorBoard, not {len(ids)}")
        bad = [i for i in ids if not _JOB_ID.match(i)]
        if bad:
            raise InvalidRequest(f"not a job id: {bad[0][:80]!r}")
        return ids

    async def jobs(self, ids: list[str]) -> list[dict]:
        """The jobs as the jobs API shows them to this server's owner (its token holds only their scopes)."""
        from trainhub.client import TrainhubAPIError, TrainhubClient, TrainhubConfigError

        try:
            client = TrainhubClient(retries=1)
        except TrainhubConfigError as e:
            raise TrainhubError(f"this server has no trainhub API configured: {e}") from None

        def fetch(job_id):
            try:
                return client.get(job_id)
            except TrainhubAPIError as e:
                if e.status in (403, 404):
                    raise NotFound(f"no job {job_id} of yours") from None
                raise TrainhubError(f"the jobs API answered: {e.message}") from None

        return [await asyncio.to_thread(fetch, i) for i in ids]

    async def open(self, ids: list[str]) -> dict:
        board = await self.boards.open(await self.jobs(self.job_ids(ids)))
        return {"url": board.prefix + "/", "jobs": list(board.jobs), "empty": board.empty}


class StatusHandler(TensorBoardHandler):
    @web.authenticated
    @authorized
    async def get(self):
        reason = self.boards.unavailable()
        self.finish({"available": True} if reason is None else {"available": False, "reason": reason})

    @web.authenticated
    @authorized
    async def post(self):
        body = parse_json(self.request.body or b"{}")
        if not isinstance(body, dict):
            raise InvalidRequest('the body must be a JSON object: {"jobs": ["j-000042"]}')
        self.set_status(201)
        self.finish(await self.open(body.get("jobs")))


class OpenHandler(TensorBoardHandler):
    """``GET .../open?jobs=a,b``: for links in notebook output (a click cannot POST)."""

    @web.authenticated
    @authorized
    async def get(self):
        ids = [i for i in self.get_argument("jobs", "").split(",")]
        self.redirect((await self.open(ids))["url"])


def default_handlers(base_url: str) -> list:
    root = url_path_join(base_url, "trainhub", "tensorboard")
    return [(root, StatusHandler), (url_path_join(root, "open"), OpenHandler)]
