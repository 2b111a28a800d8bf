"""``POST trainhub/snapshot``: every notebook kernel of this server saves its variables before a release.

The culler (and the user's "give my GPU back", through the culler) calls it just before it restarts
the server on another profile. For each running kernel, the kernel side's
:func:`trainhub.kernels.snapshot.save_for_session` is evaluated in the kernel (a silent execution:
no output, no history, no execution count) through a kernel client; the kernel writes its snapshot
under ``$TRAINHUB_SNAPSHOT_DIR`` (``<root>/.trainhub/snapshots``, the user's own home, set here for
every kernel this server starts) and the reply carries its manifest. The next kernel started for the
same notebook restores it (the IPython startup file loads ``trainhub.kernels.snapshot``).

Body (optional): ``{"timeout": seconds}`` for all kernels together (default and ceiling:
``SnapshotConfig.timeout``). A kernel that does not answer in time is reported, never waited for longer.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import time

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from trainhub import snapshots
from trainhub.exceptions import InvalidRequest
from trainhub.httpapi import JSONErrors

#: evaluated in the kernel as a user expression (an expression: it adds no name to the namespace)
SAVE_EXPRESSION = '__import__("trainhub.kernels.snapshot", fromlist=["save_for_session"]).save_for_session(get_ipython())'
DEFAULT_TIMEOUT = 60.0


def configure_kernels(root_dir: str) -> str:
    """Point the kernels this server starts at the user's snapshot folder (they inherit its environment)."""
    folder = os.environ.setdefault(snapshots.DIR_VAR, str(snapshots.default_dir(root_dir)))
    os.environ.setdefault(snapshots.ROOT_VAR, os.path.abspath(root_dir))
    return folder


async def snapshot_kernel(kernel_manager, kernel_id: str, timeout: float) -> dict:
    """Ask one kernel to save itself; its manifest, or {"error": ...}."""
    km = kernel_manager.get_kernel(kernel_id)
    client = km.client()
    client.start_channels()
    try:
        msg_id = client.execute("", silent=True, store_history=False, allow_stdin=False,
                                user_expressions={"snapshot": SAVE_EXPRESSION})
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"error": f"the kernel did not answer within {timeout:g} s (busy?)"}
            try:
                reply = await client.get_shell_msg(timeout=left)
            except Exception:  # queue.Empty on time-out
                return {"error": f"the kernel did not answer within {timeout:g} s (busy?)"}
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                break
        result = (reply["content"].get("user_expressions") or {}).get("snapshot") or {}
        if result.get("status") != "ok":
            return {"error": f"{result.get('ename', 'error')}: {result.get('evalue', reply['content'].get('status'))}"}
        return json.loads(ast.literal_eval(result["data"]["text/plain"]))
    finally:
        client.stop_channels()


async def snapshot_all(kernel_manager, session_manager, timeout: float) -> dict:
    """Every running kernel saves itself, side by side, within ``timeout`` seconds in all."""
    sessions = await session_manager.list_sessions()
    notebooks = {s["kernel"]["id"]: s.get("path") for s in sessions if s.get("kernel")}

    async def one(kid):
        try:
            out = await snapshot_kernel(kernel_manager, kid, timeout)
        except Exception as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        return {"kernel": kid, "session_path": notebooks.get(kid), **out}

    kernels = await asyncio.gather(*(one(k) for k in list(kernel_manager.list_kernel_ids())))
    return {
        "kernels": kernels,
        "saved": sum(1 for k in kernels if "kept" in k),
        "failed": sum(1 for k in kernels if "error" in k),
        "folder": os.environ.get(snapshots.DIR_VAR),
    }


class SnapshotHandler(JSONErrors, APIHandler):
    """``POST trainhub/snapshot``: see the module docstring. Needs the right to use this server's kernels."""

    auth_resource = "kernels"
    internal_error_message = "internal error while saving the kernels' variables; details are in the server log"

    @web.authenticated
    @authorized
    async def post(self):
        limit = float(self.settings.get("trainhub_snapshot_timeout", DEFAULT_TIMEOUT))
        body = self.request.body.strip()
        try:
            data = json.loads(body) if body else {}
            timeout = float(data.get("timeout", limit)) if isinstance(data, dict) else None
        except (ValueError, TypeError):
            timeout = None
        if timeout is None or not 0 < timeout:
            raise InvalidRequest('the body must be {"timeout": seconds} (a positive number) or empty')
        timeout = min(timeout, limit)
        started = time.monotonic()
        result = await snapshot_all(self.kernel_manager, self.session_manager, timeout)
        result["seconds"] = round(time.monotonic() - started, 3)
        self.log.info("trainhub snapshot: %s", json.dumps({k: v for k, v in result.items() if k != "kernels"}))
        self.finish(json.dumps(result, default=str))
