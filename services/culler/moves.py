"""What the culler does to a GPU server, and what its user says about it.

The culler's own move (stop, or release: announce it to the open pages, save the kernels' variables, stop, start
on the CPU profile), and the user's two buttons: "keep my GPU" and "give my GPU back" (the same release, now).
A mixin of :class:`~trainhub.services.culler.service.GPUCuller`, as :mod:`.regain` is, whose move back onto GPUs
uses the announcement and the snapshot written here.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from trainhub.backoff import within
from trainhub.exceptions import Conflict
from trainhub.fmt import as_utc
from trainhub.ledger import server_holder
from trainhub.services.culler.policy import RELEASE, Decision, ServerInfo


class MovesMixin:
    async def carry_out(self, info: ServerInfo, decision: Decision, server_url: str, *, cause: str,
                        stage: str) -> tuple[Decision, bool, str | None]:
        """Act on ``decision`` now, its warning withdrawn first ("keep" can no longer help; if the action fails, the
        next pass warns again before any retry). Counted as a cull for ``cause``, a failure under the ``stage`` of
        the errors. Returns the decision with what the snapshot did, whether it acted, and the error."""
        self._clear_warning(info.holder)
        try:
            snap = await self._act(info, decision, server_url)
        except Exception as e:
            self.prom.errors.labels(stage).inc()
            self.log.exception("%s of %s failed", stage, info.holder)
            return decision, False, repr(e)
        if snap is not None:
            decision = replace(decision, measurements={**decision.measurements, "snapshot": snap})
        self.prom.culls.labels(cause, decision.action).inc()
        self.prom.gpus_released.inc(len(info.devices))
        self.kept_at.pop(info.holder, None)
        return decision, True, None

    async def _act(self, info: ServerInfo, decision: Decision, server_url: str = "") -> dict | None:
        """Stop (and for release, save the kernels' variables first, restart on the CPU profile).

        Returns what the snapshot did (None when none was asked for), for the audit row.
        """
        # Unsaved browser buffers cannot be saved from here (they live in the browser);
        # JupyterLab autosaves open documents (every 120 s by default) during the warning period.
        snap = None
        if decision.action == RELEASE and server_url:
            await self._announce_move(info, server_url, "release", decision.target_profile)
        if decision.action == RELEASE and self.snapshot_on_release and server_url:
            snap = await self._snapshot(info, server_url)
        stopped = await self.client.stop_server(info.user, info.server_name)
        if decision.action == RELEASE:
            if not stopped:
                await self.client.wait_stopped(info.user, info.server_name, self.stop_timeout)
            await self.client.start_server(info.user, info.server_name, decision.target_profile)
        return snap

    async def _announce_move(self, info: ServerInfo, server_url: str, action: str, profile: str) -> None:
        """Tell the server's open pages that it moves now (trainhub/move), then give them ``move_notice_grace`` to save
        their documents; never raises: the move goes on whatever the pages heard."""
        kept = self.snapshot_on_release
        what = "onto the CPU" if action == "release" else f"onto {profile}"
        message = (f"trainhub is moving this server {what} (profile {profile}): "
                   + ("your variables are kept; " if kept else "kernel state is lost; ")
                   + "the page reconnects by itself.")
        try:
            await within(self.client.announce_move(server_url, {"action": action, "profile": profile, "message": message,
                                                                "variables": kept}), 10)
        except Exception as e:
            self.log.info("could not tell the pages of %s/%s about the move (%r); it goes on", info.user, info.server_name, e)
            return
        if self.move_notice_grace > 0:  # the pages save their documents (a save cut by the stop would hang it)
            await asyncio.sleep(self.move_notice_grace)

    async def _snapshot(self, info: ServerInfo, server_url: str) -> dict:
        """The server's kernels save their variables; never raises (a release goes on without them)."""
        try:
            result = await within(self.client.snapshot(server_url, self.snapshot_timeout), self.snapshot_timeout + 30)
        except Exception as e:
            self.prom.errors.labels("snapshot").inc()
            self.log.warning(json.dumps({"event": "culler.snapshot", "user": info.user, "server": info.server_name,
                                         "ok": False, "error": repr(e)}))
            return {"ok": False, "error": repr(e)[:500]}
        kernels = [{k: v for k, v in kernel.items() if k in ("session_path", "notebook", "kept", "not_kept", "error", "skipped")}
                   for kernel in result.get("kernels") or []]
        summary = {"ok": True, "saved": result.get("saved", 0), "failed": result.get("failed", 0), "kernels": kernels}
        self.log.info(json.dumps({"event": "culler.snapshot", "user": info.user, "server": info.server_name, **summary}))
        return summary

    # -- the user's say (HTTP API) ---------------------------------------------------

    def keep(self, user: str, server_name: str = "") -> dict:
        """The user pressed "keep my GPU": restart their idle clock, withdraw the warning."""
        holder = server_holder(user, server_name)
        now = self.policy.utcnow()
        self.kept_at[holder] = now
        self._clear_warning(holder)
        self.prom.pending_warnings.set(len(self.warnings))
        row = {"at": now, "user": user, "server": server_name, "action": "keep",
               "reason": "user pressed keep: idle clock restarted", "devices": [], "dry_run": False,
               "acted": True, "error": None, "measurements": {}}
        self.log.info(json.dumps({"event": "culler.keep", "user": user, "server": server_name, "at": now.isoformat()}))
        return row

    async def give_back(self, user: str, server_name: str = "") -> dict:
        """The user's "give my GPU back": the release the culler would do, at once, in the background.

        The kernels save their variables, the server restarts on the CPU profile (as a release does);
        answers before that starts (the request may come through the very server being restarted).
        Raises Conflict when the server holds no GPU, is not running, or there is no CPU profile.
        """
        holder = server_holder(user, server_name)
        if holder in self._regain_tasks:  # a grant for it may already be in the ledger: not the server's to give
            raise Conflict("this server is waiting to be moved to GPUs (get a GPU again); cancel that first")
        holdings = [h for h in await self._holdings() if h.kind == "server" and h.holder == holder]
        if not holdings:
            raise Conflict("this server holds no GPU: there is nothing to give back")
        if not self.policy.cpu_profile:
            raise Conflict("there is no CPU-only profile to move this server to; stop it from the hub instead")
        if holder in self._giving_back:
            raise Conflict("this server's GPUs are already being given back")
        model = await self.client.server_model(user, server_name)
        if not model or not model.get("ready") or model.get("pending"):
            raise Conflict("this server is not running (or is starting or stopping)")
        now = self.policy.utcnow()
        info = ServerInfo(user=user, server_name=server_name, devices=tuple(sorted(h.device for h in holdings)),
                          held_since=as_utc(min(h.since for h in holdings)))
        decision = Decision(RELEASE, "the user gave the GPU back: releasing",
                            {"devices": list(info.devices), "at": now.isoformat(), "requested_by": "user"},
                            target_profile=self.policy.cpu_profile)
        self._giving_back[holder] = asyncio.create_task(self._give_back(info, decision, model.get("url") or ""))
        return {"user": user, "server": server_name, "devices": list(info.devices), "profile": self.policy.cpu_profile,
                "at": now.isoformat(),
                "message": f"Giving your GPUs back: the server restarts on the {self.policy.cpu_profile} profile; "
                           + self.policy.kept_text().replace("will be kept", "will be restored in each notebook's kernel", 1)}

    async def _give_back(self, info: ServerInfo, decision: Decision, server_url: str) -> None:
        try:
            decision, acted, error = await self.carry_out(info, decision, server_url, cause="user", stage="give_back")
            if acted:
                self.culled_at[info.holder] = self.policy.utcnow()
        finally:
            self._giving_back.pop(info.holder, None)
        row = self._row(info, decision, acted=acted, error=error)
        self._record(info.holder, row, row["at"])
        await self._write_audit([row], f"the give-back of {info.holder}")
