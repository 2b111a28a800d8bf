"""'Get a GPU again': the culler's release in the other direction, through the GPU queue.

A server released to the CPU asks for GPUs again (``POST /api/regain``); the request waits in the same
queue as queued GPU servers and jobs (``trainhub.serverqueue``: the jobs service's scheduler grants it
under the same policy) while the server goes on running on the CPU, then the server is moved onto the
granted GPUs with its variables kept. A mixin of :class:`~trainhub.services.culler.service.GPUCuller`:
it uses the culler's hub client, ledger, catalog, policy clock, snapshots and audit trail.
"""

from __future__ import annotations

import asyncio
import json
import logging
from trainhub.backoff import wait_event
from trainhub.exceptions import Conflict, InvalidRequest, TrainhubError
from trainhub.ledger import server_holder
from trainhub.services.culler.policy import Decision, ServerInfo, iso_ts


class RegainMixin:
    def _server_queue(self):
        if self._queue is None:
            from trainhub.serverqueue import ServerQueue

            db_url = self.db_url or getattr(self.allocator, "db_url", "")
            if not db_url:
                raise Conflict("the culler has no platform database: it cannot queue a request for GPUs")
            self._queue = ServerQueue(db_url)
        return self._queue

    async def _user_profiles(self, user_model: dict) -> tuple[list[str], bool, list]:
        """(groups, admin, the GPU profiles the user may start)."""
        groups = [g if isinstance(g, str) else g.get("name", "") for g in user_model.get("groups") or []]
        admin = bool(user_model.get("admin"))
        return groups, admin, [p for p in self.catalog.for_user(groups, admin) if p.gpus]

    async def regain(self, user: str, server_name: str = "", profile: str | None = None, admin: bool = False) -> dict:
        """The user's "get a GPU again": the release in the other direction, once GPUs are granted.

        The request waits in the same queue as queued GPU servers and jobs (the jobs service's scheduler
        grants it under the same policy) while the server goes on running on the CPU: JupyterHub runs one
        server per name, so the GPU server cannot start beside it. Once the GPUs are held for the server, its
        kernels save their variables, it stops and starts on ``profile``, and each notebook's new kernel
        gets its variables back. Answers at once (202); :meth:`regain_status` follows it.
        Raises Conflict / InvalidRequest with what is wrong.
        """
        holder = server_holder(user, server_name)
        if holder in self._regain_tasks:
            raise Conflict("this server is already waiting for GPUs; cancel that request first to change it")
        if holder in self._giving_back:
            raise Conflict("this server's GPUs are being given back right now")
        if any(h.kind == "server" and h.holder == holder for h in await self._holdings()):
            raise Conflict("this server already holds GPUs")
        if not self.jobs_api_url:
            raise Conflict("getting a GPU again waits in the jobs service's queue, and this platform runs no jobs service")
        user_model = await self.client.user_model(user)
        model = (user_model.get("servers") or {}).get(server_name)
        if not model or not model.get("ready") or model.get("pending"):
            raise Conflict("this server is not running (or is starting or stopping); start it on a GPU profile from the hub")
        groups, is_admin, gpu_profiles = await self._user_profiles({**user_model, "admin": admin or user_model.get("admin")})
        if profile is None:
            if not gpu_profiles:
                raise Conflict("no GPU profile is open to you")
            chosen = min(gpu_profiles, key=lambda p: p.gpus)
        else:
            try:
                chosen = self.catalog.resolve(profile, groups, is_admin)
            except TrainhubError as e:
                raise InvalidRequest(e.message) from None
            if not chosen.gpus:
                raise InvalidRequest(f"profile {chosen.slug!r} has no GPU; pick one of: "
                                     f"{', '.join(p.slug for p in gpu_profiles) or 'none'}")
        pool = [d for d in await asyncio.to_thread(self.allocator.devices)
                if not chosen.gpu_model or chosen.gpu_model.lower() in d.name.lower()]
        if len(pool) < chosen.gpus:
            raise Conflict(f"profile {chosen.slug!r} needs {chosen.gpus} GPUs and this platform has {len(pool)}")
        queue = self._server_queue()
        await asyncio.to_thread(queue.enqueue, holder, user=user, groups=groups, gpus=chosen.gpus, profile=chosen.slug,
                                gpu_model=chosen.gpu_model, reason="waiting for the scheduler's next pass")
        now = self.policy.utcnow()
        state = {"user": user, "server": server_name, "profile": chosen.slug, "gpus": chosen.gpus, "state": "waiting",
                 "asked_at": now.isoformat(), "position": None, "waiting": None, "reason": "waiting for the scheduler's next pass",
                 "eta": None, "devices": [], "message": "", "finished_at": None}
        kept = ("your variables will be restored in each notebook's kernel (picklable values; tensors stay on the CPU: "
                "move them with .to('cuda')); open files, generators, locks and other values that cannot be pickled will not"
                if self.snapshot_on_release else "unsaved kernel state (variables, models in memory) will be lost")
        state["message"] = (f"In line for {chosen.display_name}: this server goes on running on the CPU until "
                            f"the GPUs are yours, then restarts on them; {kept}")
        self.regains[holder] = state
        self._regain_wake[holder] = asyncio.Event()
        self._regain_tasks[holder] = asyncio.create_task(self._regain(holder, state, model.get("url") or ""))
        self.log.info(json.dumps({"event": "culler.regain", "user": user, "server": server_name, "state": "waiting",
                                  "profile": chosen.slug}))
        return dict(state)

    def regain_status(self, user: str, server_name: str = "") -> dict | None:
        state = self.regains.get(server_holder(user, server_name))
        return {k: v for k, v in state.items() if k != "cancel"} if state else None

    def cancel_regain(self, user: str, server_name: str = "") -> dict:
        """Withdraw a request still waiting in line (a move under way cannot be cancelled)."""
        holder = server_holder(user, server_name)
        state, task = self.regains.get(holder), self._regain_tasks.get(holder)
        if task is None or state is None:
            raise Conflict("this server is not waiting for GPUs")
        if state["state"] != "waiting":
            raise Conflict("the GPUs are granted and the server is being moved onto them; it cannot be cancelled now")
        state["cancel"] = True  # seen at the request's next look (its task withdraws it, gives a late grant back)
        self._regain_wake[holder].set()
        return {"user": user, "server": server_name, "message": "Request withdrawn: the server stays on the CPU."}

    async def _regain(self, holder: str, state: dict, server_url: str) -> None:
        from trainhub.serverqueue import GRANTED

        queue = self._server_queue()
        user, server_name = state["user"], state["server"]
        started = asyncio.get_running_loop().time()
        beat: asyncio.Task | None = None
        snap, error, moving = None, None, False
        wake = self._regain_wake[holder]
        try:
            looks = 0
            while True:
                if state.get("cancel"):
                    raise asyncio.CancelledError
                row = await asyncio.to_thread(queue.heartbeat, holder)
                if row is None:
                    raise RuntimeError("the request was dropped from the queue")
                state.update(reason=row.reason, position=row.position, waiting=row.waiting,
                             eta=iso_ts(row.eta) if row.eta else None)
                if row.state == GRANTED:
                    state.update(state="granted", devices=list(row.devices), reason="GPUs assigned", position=None)
                    break
                looks += 1
                if looks % 5 == 0:  # the user may stop the server meanwhile
                    model = await self.client.server_model(user, server_name)
                    if not model or not model.get("ready") or model.get("pending"):
                        raise RuntimeError("the server stopped while it waited for GPUs")
                if asyncio.get_running_loop().time() - started > self.regain_max_wait:
                    raise RuntimeError(f"no GPU was granted within {self.regain_max_wait:g} s (last: {row.reason})")
                await wait_event(wake, self.regain_heartbeat)
                if state.get("cancel"):
                    raise asyncio.CancelledError
            # the GPUs are held for the server: keep the request alive while the server moves onto them
            moving = True

            async def heartbeat():
                while True:
                    await asyncio.to_thread(queue.heartbeat, holder)
                    await asyncio.sleep(self.regain_heartbeat)

            beat = asyncio.create_task(heartbeat())
            state["state"] = "restarting"
            info = ServerInfo(user=user, server_name=server_name, devices=tuple(state["devices"]),
                              held_since=self.policy.utcnow())
            if server_url:
                await self._announce_move(info, server_url, "regain", state["profile"])
            if self.snapshot_on_release and server_url:
                snap = await self._snapshot(info, server_url)
            stopped = await self.client.stop_server(user, server_name)
            if not stopped:
                await self.client.wait_stopped(user, server_name, self.stop_timeout)
            await self.client.start_server(user, server_name, state["profile"])
            # the spawner takes the devices over when it allocates for the same holder; leave the grant
            # standing until it has (its process recorded) or the start ended
            await self.client.wait_started(user, server_name, self.start_timeout)
            state.update(state="done", message=f"The server runs on {state['profile']} with GPUs "
                                               f"{', '.join(map(str, state['devices']))}; each notebook's kernel gets its variables back.")
        except asyncio.CancelledError:
            error = "cancelled by the user"
            state.update(state="cancelled", message="Request withdrawn: the server stays on the CPU.")
        except Exception as e:
            error = str(e) or repr(e)
            self.prom.errors.labels("regain").inc()
            self.log.warning("get-a-GPU-again of %s failed: %s", holder, error, exc_info=self.log.isEnabledFor(logging.DEBUG))
            state.update(state="failed", message=f"Could not move the server to GPUs: {error}")
        finally:
            if beat is not None:
                beat.cancel()
            await asyncio.to_thread(queue.withdraw, holder)
            if error is not None and not moving:
                # a grant that came with the failure or cancellation goes back to the pool (no process holds it)
                if not any(h.pid for h in await asyncio.to_thread(self.allocator.holdings) if h.holder == holder):
                    await asyncio.to_thread(self.allocator.release, holder)
            self._regain_tasks.pop(holder, None)
            self._regain_wake.pop(holder, None)
            state.pop("cancel", None)
        waited = round(asyncio.get_running_loop().time() - started, 1)
        reason = (f"the user asked for a GPU again: restarted on {state['profile']} after {waited:g} s"
                  if error is None else f"the user asked for a GPU again: {error}")
        measurements = {"profile": state["profile"], "devices": state["devices"], "seconds": waited, "requested_by": "user"}
        if snap is not None:
            measurements["snapshot"] = snap
        info = ServerInfo(user=user, server_name=server_name, devices=tuple(state["devices"]),
                          held_since=self.policy.utcnow())
        row = self._row(info, Decision("regain", reason, measurements), acted=error is None, error=error)
        if error is None:
            self.habits.observe_row(row)  # the user came back: the released idle gap ends (when they asked)
        self.log.info(json.dumps({"event": "culler.regain", "user": user, "server": server_name, "state": state["state"],
                                  "reason": reason}, default=str))
        if self.audit is not None:
            try:
                await asyncio.to_thread(self.audit.append, [row])
            except Exception:
                self.prom.errors.labels("audit").inc()
                self.log.exception("cannot write the get-a-GPU-again of %s to the audit trail (it is in this log)", holder)
        state["finished_at"] = self.policy.utcnow().isoformat()  # last: everything about it is recorded

