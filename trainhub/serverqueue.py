"""Notebook servers waiting in line for GPUs: the rows the spawner and the jobs engine share.

A GPU server whose devices are all held (or whose user or group is at its quota) does not fail: the
spawner writes a request here and waits; the jobs engine puts the request in the same scheduling
pass as queued jobs (same policy: priorities, fair share, reservations, no starvation), and when
the request's turn comes it takes the devices in the ledger for the server's holder and marks the
request granted; the spawner then starts the server on them. While a request waits, each pass
writes its position, the scheduler's reason and the estimated start (from running work's time
limits and the head's reservation), which the spawner shows as JupyterHub progress events.

A request whose spawner stopped looking (a cancelled spawn, a restarted hub) is dropped after
:data:`STALE_AFTER` seconds without a heartbeat, and what it was granted goes back to the pool.

The culler's "get a GPU again" waits here too, for a server that runs on the CPU meanwhile: the
culler heartbeats the request instead of a spawner, and once it is granted the devices are held
in the ledger under the server's holder, with no process, until the server restarts on the GPU
profile and its spawner takes them over (its allocation for the same holder replaces them). Until
then :meth:`ServerQueue.granted_holders` tells the hub's ledger reconciler and the stopping CPU
server's spawner to leave them alone.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass

from sqlalchemy import JSON, Float, Integer, String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from trainhub.db import Base, SQLiteReader, get_engine, init_db, session_factory, write_session
from trainhub.fmt import plural

WAITING, GRANTED = "waiting", "granted"
STALE_AFTER = 60.0  # seconds without the spawner's heartbeat


class ServerRequest(Base):
    __tablename__ = "server_requests"

    holder: Mapped[str] = mapped_column(String(255), primary_key=True)  # the ledger holder, "server:alice/"
    user: Mapped[str] = mapped_column(String(255), index=True)
    groups: Mapped[list] = mapped_column(JSON, default=list)
    gpus: Mapped[int] = mapped_column(Integer)
    profile: Mapped[str] = mapped_column(String(255))
    gpu_model: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created: Mapped[float] = mapped_column(Float)
    seen: Mapped[float] = mapped_column(Float)  # the spawner's last heartbeat
    state: Mapped[str] = mapped_column(String(16), default=WAITING)
    reason: Mapped[str] = mapped_column(String(1000), default="")
    position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    waiting: Mapped[int | None] = mapped_column(Integer, nullable=True)  # requests and jobs waiting for GPUs
    eta: Mapped[float | None] = mapped_column(Float, nullable=True)  # the scheduler's reserved start (epoch), if any
    devices: Mapped[list] = mapped_column(JSON, default=list)


@dataclass(frozen=True)
class QueuedServer:
    holder: str
    user: str
    groups: tuple[str, ...]
    gpus: int
    profile: str
    gpu_model: str | None
    created: float
    seen: float
    state: str
    reason: str
    position: int | None
    waiting: int | None
    eta: float | None
    devices: tuple[int, ...]

    @property
    def name(self) -> str:
        """How the scheduler's messages name it ("alice's notebook server", "alice's server gpu-box")."""
        server = self.holder.split("/", 1)[1] if "/" in self.holder else ""
        return f"{self.user}'s server {server}" if server else f"{self.user}'s notebook server"


def _value(r) -> QueuedServer:
    """A row (ORM instance or Core row) as the value callers get."""
    return QueuedServer(r.holder, r.user, tuple(r.groups or ()), r.gpus, r.profile, r.gpu_model, r.created, r.seen,
                        r.state, r.reason or "", r.position, r.waiting, r.eta,
                        tuple(r.devices or ()))


_ALL = select(*ServerRequest.__table__.columns).order_by(ServerRequest.created)


class ServerQueue:
    """The queue's rows (synchronous: callers run these on a thread)."""

    def __init__(self, db_url: str):
        self.db_url = db_url
        init_db(db_url)
        self._session = session_factory(db_url)
        self._reader = SQLiteReader.for_engine(get_engine(db_url))

    def enqueue(self, holder: str, *, user: str, groups, gpus: int, profile: str, gpu_model: str | None,
                reason: str) -> QueuedServer:
        now = time.time()
        with write_session(self.db_url) as s:
            s.execute(delete(ServerRequest).where(ServerRequest.holder == holder))
            row = ServerRequest(holder=holder, user=user, groups=list(groups), gpus=gpus, profile=profile,
                                gpu_model=gpu_model, created=now, seen=now, state=WAITING, reason=reason)
            s.add(row)
            s.commit()
            return _value(row)

    def heartbeat(self, holder: str) -> QueuedServer | None:
        """The spawner's look at its request; keeps it alive."""
        with write_session(self.db_url) as s:
            row = s.get(ServerRequest, holder)
            if row is None:
                return None
            row.seen = time.time()
            s.commit()
            return _value(row)

    def withdraw(self, holder: str) -> None:
        with write_session(self.db_url) as s:
            s.execute(delete(ServerRequest).where(ServerRequest.holder == holder))
            s.commit()

    def get(self, holder: str) -> QueuedServer | None:
        with self._session() as s:
            row = s.get(ServerRequest, holder)
            return None if row is None else _value(row)

    def granted_holders(self) -> set[str]:
        """Holders whose request was granted and is still looked after (its devices wait for the server's start)."""
        now = time.time()
        with self._session() as s:
            return {r.holder for r in s.scalars(select(ServerRequest).where(ServerRequest.state == GRANTED))
                    if now - r.seen <= STALE_AFTER}

    def all(self) -> list[QueuedServer]:
        # Core rows (the same attribute names as the ORM's; through SQLiteReader on SQLite): every scheduling
        # pass of the jobs engine reads this
        if self._reader is not None:
            return [_value(r) for r in self._reader.rows(_ALL)]
        with get_engine(self.db_url).connect() as c:
            return [_value(r) for r in c.execute(_ALL)]

    def grant(self, holder: str, devices: list[int]) -> bool:
        with write_session(self.db_url) as s:
            row = s.get(ServerRequest, holder)
            if row is None or row.state != WAITING:
                return False
            row.state, row.devices, row.reason, row.position, row.eta = GRANTED, list(devices), "GPUs assigned", None, None
            s.commit()
            return True

    def update_waiting(self, rows: dict[str, tuple[str, int | None, int, float | None]]) -> None:
        """``{holder: (reason, position, waiting, eta)}`` for this pass, in one transaction."""
        if not rows:
            return
        with write_session(self.db_url) as s:
            for r in s.scalars(select(ServerRequest).where(ServerRequest.holder.in_(list(rows)), ServerRequest.state == WAITING)):
                r.reason, r.position, r.waiting, r.eta = rows[r.holder]
            s.commit()


#: What a "Start ... now" button of the pending page does (an inline handler: the page sets each progress event's
#: ``html_message`` as HTML): stop this pending spawn through the hub's API (the cookie and the page's XSRF token, as
#: the page's own Stop Server button), wait until the hub no longer holds it pending, then start the server again
#: through the hub's spawn URL with the button's profile (``/hub/spawn/USER[/SERVER]?profile=SLUG``).
SWITCH_SCRIPT = """(function (b) {
  var d = window.jhdata || {}, base = d.base_url || '/hub/';
  var m = window.location.pathname.match(/spawn-pending\\/([^/]+)(?:\\/([^/?#]+))?/);
  if (!m) { return; }
  var user = m[1], server = m[2] || '', q = d.xsrf_token ? '?_xsrf=' + encodeURIComponent(d.xsrf_token) : '';
  var say = function (text) { b.textContent = text; };
  b.disabled = true; say('Stopping the wait...');
  var api = base + 'api/users/' + user + (server ? '/servers/' + server : '/server');
  fetch(api + q, {method: 'DELETE', credentials: 'same-origin'}).then(function (r) {
    if (!r.ok && r.status !== 400) { throw new Error('the hub answered ' + r.status); }
    var left = 120;
    var check = function () {
      fetch(base + 'api/users/' + user + q, {credentials: 'same-origin'}).then(function (r) { return r.json(); }).then(function (u) {
        var s = (u.servers || {})[server];
        if (!s || !s.pending) {
          window.location.href = base + 'spawn/' + user + (server ? '/' + server : '') + '?profile=' + encodeURIComponent(b.getAttribute('data-profile'));
        } else if (--left > 0) { setTimeout(check, 500); } else { say('The wait did not stop; reload the page'); }
      });
    };
    check();
  }).catch(function (e) { b.disabled = false; say('Could not stop the wait (' + e.message + '); try again'); });
})(this)"""


def free_profile_button(slug: str, name: str) -> str:
    """A button of the pending page that starts the server on profile ``slug`` now (see :data:`SWITCH_SCRIPT`)."""
    return (f'<button type="button" class="btn btn-sm btn-primary trainhub-start-free" data-profile="{html.escape(slug)}" '
            f'onclick="{html.escape(SWITCH_SCRIPT)}">Start {html.escape(name)} now</button>')


class QueueView:
    """What the spawner shows while its request waits: JupyterHub progress events built from the
    request's row (position, the scheduler's reason, the estimate) and the profiles free now (each a
    button on the pending page that starts the server on it at once)."""

    def __init__(self, profile: str, gpus: int):
        self.profile, self.gpus = profile, gpus
        self.row: QueuedServer | None = None
        self.free_now: list[tuple[str, str]] = []
        self.done = False

    def update(self, row: QueuedServer, free_now: list) -> None:
        """``free_now``: the profiles the user could start at once, as ``(slug, display name)`` (a bare name: text only)."""
        self.row = row
        self.free_now = [(p, p) if isinstance(p, str) else (p[0], p[1]) for p in free_now]

    def text(self) -> tuple[str, str]:
        """(plain, html) description of the wait."""
        r = self.row
        head = f"{self.profile}: in line for {plural(self.gpus, 'GPU')}"
        if r is None:
            return head + "...", html.escape(head + "...")
        if r.position:
            head += f", number {r.position} of {r.waiting} waiting for GPUs"
        core = f"{head}. {r.reason[:1].upper()}{r.reason[1:].rstrip('.')}"
        if r.eta is not None:
            core += f" (about {time.strftime('%H:%M', time.localtime(r.eta))})"
        core += "."
        if not self.free_now:
            return core, html.escape(core)
        free = ", ".join(name for _, name in self.free_now)
        buttons = " ".join(free_profile_button(slug, name) for slug, name in self.free_now)
        return (f"{core} Free now: {free} (stop waiting and start on one of them at once: its button on the "
                "spawn page, or stop the server and start it again with that profile).",
                f"{html.escape(core)}<br><strong>Free now:</strong> {buttons} "
                "<span class=\"text-muted\">(stops waiting and starts your server on it at once)</span>")

    def event(self) -> dict:
        if self.row is not None and self.row.state == GRANTED:
            return {"progress": 50, "message": f"GPUs {', '.join(map(str, self.row.devices))} assigned; starting the server..."}
        plain, rich = self.text()
        return {"progress": 10, "message": plain, "html_message": rich}
