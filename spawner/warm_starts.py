"""Warm starts for the local spawner: its options for the warm pool, and claiming an interpreter for a server.

The pool itself (processes, claims, priorities) is ``trainhub.spawner.warm`` and its demand model
``trainhub.spawner.demand``; this mixin is what ``LocalGPUSpawner`` adds to them: the pool for its launch command,
sized from its configuration, and the decision whether a server may start warm at all (a cold start must be what
the warm one replaces, so anything that could make them differ starts cold).
"""

from __future__ import annotations

import asyncio
import os
import sys

from traitlets import Bool, Float, Integer, List, TraitError, Unicode, Union, default, validate
from traitlets.config import LoggingConfigurable

from trainhub.boundary import keeper
from trainhub.boundary.warmsandbox import sandbox_mounts
from trainhub.fmt import parse_size

from .demand import PoolDemand
from .warm import DEFAULT_IMPORTS, WarmPool, WarmProcess, WarmUnavailable, claim_spec, launch_env, pool_for, startup_differences, warm_argv


def budget_bytes(value) -> int:
    """``warm_pool_memory_budget`` in bytes: 0 (or "0", "") for no bound, else trainhub.fmt.parse_size's reading."""
    if value in (0, "0", ""):
        return 0
    return parse_size(value)


class WarmStarts(LoggingConfigurable):
    """The warm-pool options and warm start path of ``LocalGPUSpawner`` (configured as ``c.LocalGPUSpawner.*``)."""

    warm_start = Bool(
        True,
        help="Start servers from a small pool of warm interpreters that have imported the server's modules "
        "(trainhub.spawner.warm; docs/isolation.md says why nothing passes between users): each is claimed by one "
        "spawn, given the user's mounts, environment, token, devices, working folder and account, then runs "
        "`python -m <module>` as a cold start would. A spawn starts cold when the pool is empty, the claim fails, "
        "Spawner.cmd is not `<this interpreter> -m <module>`, popen_kwargs are set, a start-up variable (PYTHON*, "
        "LD_*, locale) differs, or the sandbox runs without root. False: every server starts cold.",
    ).tag(config=True)

    warm_pool_size = Integer(
        2,
        help="Warm interpreters always kept waiting (about 140 MB of memory each, with keeper and sandbox): the pool's floor; it grows beyond "
        "it with demand (warm_pool_per_arrival, warm_pool_lead) within warm_pool_memory_budget. 0 = none (as "
        "warm_start = False).",
    ).tag(config=True)

    warm_pool_memory_budget = Union(
        [Integer(), Unicode()], default_value="1GiB",
        help="Memory the waiting warm interpreters may hold together, in bytes or with a unit (\"1GiB\", \"800MB\"): "
        "the pool never grows past what fits, measured from the resident memory of its own interpreters (with their "
        "keeper and sandbox) as they become ready. 0 = no bound. It bounds the floor too.",
    ).tag(config=True)

    warm_pool_window = Float(
        900.0,
        help="Seconds a spawn counts as recent for the pool's rush term (warm_pool_per_arrival); with no spawn for this "
        "long (and none usual ahead, warm_pool_lead) the pool shrinks back to warm_pool_size.",
    ).tag(config=True)

    warm_pool_per_arrival = Float(
        2.0,
        help="Warm interpreters the pool's target grows by for each spawn of the last warm_pool_window seconds, above "
        "warm_pool_size: users arrive together, so each one who came predicts more. 0 = no rush term.",
    ).tag(config=True)

    warm_pool_lead = Float(
        1800.0,
        help="Seconds ahead the time-of-day term looks: the pool holds as many interpreters as past days saw spawns in "
        "the coming warm_pool_lead seconds at this time of day (averaged over the days anyone came, "
        "warm_pool_history_days back), so it grows before the usual morning arrivals. 0 = no time-of-day term.",
    ).tag(config=True)

    warm_pool_history_days = Integer(
        14,
        help="Days of spawn times (times only, no user names) the time-of-day term learns from.",
    ).tag(config=True)

    warm_pool_history_file = Unicode(
        help="File keeping the spawn times across hub restarts. Default: $TRAINHUB_DATA_DIR/warm-pool-arrivals.json "
        "(none without a data dir: the history is then the hub process's).",
    ).tag(config=True)

    warm_pool_parallel_starts = Integer(
        help="Warm interpreters importing at once while the pool refills (default: the machine's CPU count): the "
        "first of a refill is ready sooner than if all started together.",
    ).tag(config=True)

    warm_pool_interval = Float(
        60.0,
        help="Seconds between the pool's own checks of its target (grow before the usual arrivals, shrink when idle); "
        "spawns retarget it at once besides.",
    ).tag(config=True)

    @default("warm_pool_history_file")
    def _warm_pool_history_file_default(self):
        data = os.environ.get("TRAINHUB_DATA_DIR", "")
        return os.path.join(data, "warm-pool-arrivals.json") if data else ""

    @default("warm_pool_parallel_starts")
    def _warm_pool_parallel_default(self):
        return os.cpu_count() or 1

    @validate("warm_pool_memory_budget")
    def _check_budget(self, proposal):
        try:
            return budget_bytes(proposal["value"])
        except ValueError as e:
            raise TraitError(f"LocalGPUSpawner.warm_pool_memory_budget: {e} (0 = no bound)") from None

    @validate("warm_pool_size", "warm_pool_history_days", "warm_pool_window", "warm_pool_per_arrival", "warm_pool_lead")
    def _check_not_negative(self, proposal):
        if proposal["value"] < 0:
            raise TraitError(f"LocalGPUSpawner.{proposal['trait'].name} must be zero or more, not {proposal['value']}")
        return proposal["value"]

    @validate("warm_pool_parallel_starts", "warm_pool_interval")
    def _check_positive(self, proposal):
        if proposal["value"] <= 0:
            raise TraitError(f"LocalGPUSpawner.{proposal['trait'].name} must be more than zero, not {proposal['value']}")
        return proposal["value"]

    warm_imports = List(
        Unicode(), list(DEFAULT_IMPORTS),
        help="Modules a warm interpreter imports while it waits (before any user's identity): the server's heavy "
        "modules. Only modules whose import reads nothing of a user belong here.",
    ).tag(config=True)

    warm_claim_timeout = Float(
        15.0,
        help="Seconds a warm interpreter has to take on its server (mounts, identity) before the spawn starts cold.",
    ).tag(config=True)

    started_warm = Bool(False, help="The server started from a warm interpreter (state, for the log and tests).")

    def _warm_pool(self) -> WarmPool | None:
        """The hub's pool for this spawner's launch, or None where warm starts cannot be as correct as cold ones."""
        if not self.warm_start or self.warm_pool_size <= 0:
            return None
        if self.isolation.use_sandbox and os.geteuid() != 0:
            return None  # an unprivileged sandbox cannot take on mounts made outside it
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", os.defpath)
        env = launch_env(self.env_keep, self.environment, path)
        python, imports = sys.executable, list(self.warm_imports)

        def argv_for(fd: int) -> list[str]:  # under a keeper, as a cold server: it may become one
            return keeper.argv(self.isolation.command(warm_argv(python, fd, imports), account=None, cwd="/"))

        pool = pool_for(argv_for, env, self.warm_pool_size, self.log)
        self._follow_demand(pool)
        return pool

    def _follow_demand(self, pool: WarmPool) -> None:
        """The pool's demand model and bounds from this configuration; its periodic check started once a loop runs."""
        if pool.demand is None:
            pool.demand = PoolDemand(self.warm_pool_size, path=self.warm_pool_history_file)
        d = pool.demand
        d.window, d.per_arrival, d.lead = self.warm_pool_window, self.warm_pool_per_arrival, self.warm_pool_lead
        d.history_days = self.warm_pool_history_days
        pool.budget = budget_bytes(self.warm_pool_memory_budget)  # the default is not validated: "1GiB" as given
        pool.parallel = self.warm_pool_parallel_starts
        pool.retarget()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        pool.start_loop(lambda: self.warm_pool_interval)

    def _warm_refusal(self, pool: WarmPool, cmd: list[str], env: dict) -> str:
        """Why this server cannot start warm ("" when it can)."""
        if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m":
            return f"Spawner.cmd {cmd[:3]} is not '{sys.executable} -m <module>'"
        if self.popen_kwargs:
            return "popen_kwargs are set"
        diff = startup_differences(env, pool.env)
        if diff:
            return f"start-up variables differ from the warm interpreters': {', '.join(diff)}"
        return ""

    async def _start_warm(self, pool: WarmPool, rw: list[str], ro: list[str]) -> bool:
        """Claim a warm interpreter for this server; False (the caller starts it cold) when none can be."""
        cmd = list(self.cmd) + self.get_args()
        refusal = self._warm_refusal(pool, cmd, self.get_env())
        if refusal:
            self.log.info("%s starts cold: %s", self._log_name, refusal)
            return False
        wp = await pool.take()
        if wp is None:
            self.log.info("%s starts cold: no warm interpreter waiting (%s)", self._log_name, pool.describe())
            return False
        cold_token, self.spawn_token = self.spawn_token, wp.token  # the marker it was started with
        try:
            await self._claim(pool, wp, cmd, rw, ro)
        except WarmUnavailable as e:
            self.spawn_token = cold_token
            self.log.warning("%s starts cold: the warm interpreter failed its claim (%s)", self._log_name, e)
            return False
        self.proc, self.pid = wp.proc, wp.pid
        self.log.info("Spawning %s from warm interpreter %s (claim %d; %s)", self._log_name, wp.pid, pool.claims,
                      f"waited {wp.waited:.1f} s for its imports" if wp.waited > 0.05 else "it was ready")
        return True

    async def _claim(self, pool: WarmPool, wp: WarmProcess, cmd: list[str], rw: list[str], ro: list[str]) -> None:
        env = self.get_env()
        mounts: list[tuple[str, bool, bool]] = []
        cwd = self.home_dir
        if self.sandboxed:  # what a cold sandbox binds beyond the warm one's (Isolation.sandbox_argv), parents first
            cwd = os.path.realpath(self.home_dir)
            mounts = sandbox_mounts(rw, ro, self.isolation.device_nodes(self.devices))
        await pool.claim(wp, claim_spec(cmd, env, cwd, self.account, self.sandboxed), mounts, self.warm_claim_timeout,
                         netns=self.netns or None)
