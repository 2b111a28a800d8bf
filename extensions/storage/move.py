"""``POST|GET trainhub/move``: the open JupyterLab pages of this server learn that trainhub is moving it.

A move (the culler's idle release, "Give my GPU back", "Get a GPU again") saves the kernels' variables, stops the
server and starts it again on another profile. Without a word beforehand, every open page met a server that was
gone and JupyterLab asked "Server unavailable or unreachable... Restart?", once per lost connection, beside
trainhub's own notice. So the culler announces the move here first (``POST``, the culler's hub token; best effort,
a second at most): the server emits the event :data:`SCHEMA_ID` on jupyter-server's event bus, which every open page
receives at once (``/api/events/subscribe``, JupyterLab's ``serviceManager.events``), and keeps it for ``GET`` (a page
that opened or reconnected after the event). The pages then show one notice with the move's progress, keep
JupyterLab's connection-lost dialog for this move to themselves, and reload once the server answers again.

Body: ``{"action": "release" | "regain", "profile": "<slug it moves to>", "message": "...", "variables": true}``
(``variables``: the kernels' variables are kept). ``GET`` answers ``{"move": <the body, with "at"> | null}``.
"""

from __future__ import annotations

import json
import time

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from trainhub.exceptions import InvalidRequest
from trainhub.httpapi import JSONErrors

SCHEMA_ID = "https://schema.trainhub.dev/events/server-move"
SCHEMA = {
    "$id": SCHEMA_ID,
    "version": 1,
    "title": "trainhub moves this server",
    "description": "Emitted just before trainhub saves the kernels' variables, stops this server and starts it on "
                   "another profile (an idle release, give my GPU back, get a GPU again).",
    "type": "object",
    "properties": {
        "action": {"enum": ["release", "regain"], "description": "release: onto the CPU profile; regain: onto GPUs"},
        "profile": {"type": "string", "description": "the profile the server restarts on"},
        "message": {"type": "string", "description": "what happens, for the person at the notebook"},
        "variables": {"type": "boolean", "description": "the kernels' variables are kept"},
        "at": {"type": "number", "description": "when the move was announced (seconds since the epoch)"},
    },
    "required": ["action", "profile"],
}
MAX_TEXT = 500


def register(serverapp) -> None:
    """The event's schema on the server's event bus (once per server)."""
    logger = getattr(serverapp, "event_logger", None)
    if logger is not None and SCHEMA_ID not in logger.schemas:
        logger.register_event_schema(SCHEMA)


def parse(body: bytes) -> dict:
    try:
        data = json.loads(body) if body.strip() else None
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("action") not in ("release", "regain"):
        raise InvalidRequest('the body must be {"action": "release" | "regain", "profile": "<slug>", "message": "..."}')
    profile, message = data.get("profile"), data.get("message", "")
    if not isinstance(profile, str) or not profile or len(profile) > 64 or not isinstance(message, str):
        raise InvalidRequest("profile must be a profile's slug and message a string")
    return {"action": data["action"], "profile": profile, "message": message[:MAX_TEXT],
            "variables": bool(data.get("variables", True)), "at": time.time()}


class MoveHandler(JSONErrors, APIHandler):
    """See the module docstring. Needs the right to use this server (the culler's token has it, as for snapshots)."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def post(self):
        move = parse(self.request.body)
        self.settings["trainhub_move"] = move
        logger = self.settings.get("event_logger")
        if logger is not None:
            logger.emit(schema_id=SCHEMA_ID, data=move)
        self.log.info("trainhub move announced: %s", json.dumps(move))
        self.finish(json.dumps({"move": move}))

    @web.authenticated
    @authorized
    async def get(self):
        self.finish(json.dumps({"move": self.settings.get("trainhub_move")}))
