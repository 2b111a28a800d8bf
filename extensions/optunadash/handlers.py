"""Handlers of the optuna-dashboard hand-off (see the package docstring for the routes)."""

from __future__ import annotations

import asyncio
import re

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from trainhub.httpapi import JSONErrors

from .manager import Dashboard

_SWEEP = re.compile(r"^s-\d{1,12}$")


class DashboardHandler(JSONErrors, APIHandler):
    auth_resource = "trainhub"
    internal_error_message = "internal error in the optuna-dashboard hand-off; details are in the server log"

    @property
    def dash(self) -> Dashboard:
        return self.settings["trainhub_optuna_dashboard"]


class StatusHandler(DashboardHandler):
    @web.authenticated
    @authorized
    async def get(self):
        reason = self.dash.unavailable()
        self.finish({"available": True, "storage": self.dash.storage} if reason is None
                    else {"available": False, "reason": reason})


class OpenHandler(DashboardHandler):
    """``GET .../open[?sweep=s-000003]``: for links in notebook output and the panel (a click cannot POST)."""

    @web.authenticated
    @authorized
    async def get(self):
        url = await self.dash.open() + "dashboard"
        sweep = self.get_argument("sweep", "")
        if _SWEEP.match(sweep):
            study = await asyncio.to_thread(self.dash.study_id, sweep)
            if study is not None:
                url += f"/studies/{study}"
        self.redirect(url)


def default_handlers(base_url: str) -> list:
    root = url_path_join(base_url, "trainhub", "optuna")
    return [(root, StatusHandler), (url_path_join(root, "open"), OpenHandler)]
