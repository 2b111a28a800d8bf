"""The Optuna side of a sweep: its sampler and pruner from the sweep's settings, how many next trials may be asked
ahead without changing what they get, and Optuna's SQLite connections without an fsync of their own.
"""

from __future__ import annotations

from trainhub.searchspace import grid_points
from trainhub.states import COMPLETE, PRUNED, TRIAL_FINAL


def default_startup(n_trials: int) -> int:
    """Trials finished before TPE models and before the median pruner compares: Optuna's defaults
    (10 and 5) would leave a small sweep purely random and unpruned."""
    return max(1, min(5, n_trials // 4))


def tpe_startup(settings: dict, n_trials: int) -> int:
    """Finished trials before TPE models (before that it samples at random)."""
    startup = settings.get("startup_trials")
    return startup if startup is not None else max(2, default_startup(n_trials))


def ahead_allowed(settings: dict, n_trials: int, parallel: int, trials: list) -> int:
    """How many next trials may be asked before their slots free (so that no ask is on the way from one trial's end
    to the next one's start), each with exactly the parameters it would get when asked then: the random and grid
    samplers' suggestions do not depend on finished trials (the grid skips running points as it skips finished
    ones), and TPE samples at random while fewer than its startup trials have finished: the j-th next trial is
    still a random one if, even when every unfinished trial and the j-1 before it finish first, fewer than that
    have. Other samplers (CMA-ES, TPE once it models) learn from the trials still running: they ask when a slot
    frees. ``trials``: the sweep's trial rows (those asked ahead have none); at most ``parallel``."""
    left = max(0, min(parallel, n_trials - len(trials)))
    kind = settings.get("sampler") or "tpe"
    if kind in ("random", "grid"):
        return left
    if kind == "tpe":
        counted = sum(t.state in (COMPLETE, PRUNED) for t in trials)
        unfinished = sum(t.state not in TRIAL_FINAL for t in trials)
        return max(0, min(left, tpe_startup(settings, n_trials) - counted - unfinished))
    return 0


def make_sampler(settings: dict, space: dict, n_trials: int):
    import optuna

    seed = settings.get("seed")
    startup = settings.get("startup_trials")
    kind = settings.get("sampler") or "tpe"
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        return optuna.samplers.GridSampler(grid_points(space), seed=seed)
    if kind == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=startup if startup is not None else default_startup(n_trials))
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True, n_startup_trials=tpe_startup(settings, n_trials))


def make_pruner(settings: dict, n_trials: int):
    import optuna

    kind = settings.get("pruner") or "median"
    warmup = int(settings.get("prune_after") or 0)
    if kind == "none":
        return optuna.pruners.NopPruner()
    if kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, warmup))
    startup = settings.get("startup_trials")
    return optuna.pruners.MedianPruner(n_startup_trials=startup if startup is not None else default_startup(n_trials),
                                       n_warmup_steps=warmup)


def no_fsync_of_its_own(engine) -> None:
    """Optuna's SQLite connections commit without waiting for an fsync (``synchronous=NORMAL``; the platform
    database is in WAL mode): an ask or a tell is 3-4 commits, each an fsync of several ms on a busy disk, all on
    the way from one trial's end to the next one's start. Nothing is at risk beyond the platform database's own
    setting (trainhub.db.sync_mode): a commit is atomic either way, and every Optuna write is followed by the
    controller's own write of the trial row (with ``$TRAINHUB_DB_SYNC=full`` a full-sync commit of the same WAL,
    which makes the Optuna frames before it durable too); a power cut between the two is the crash the
    controller already reconciles after a restart."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _normal_sync(dbapi_conn, _record):
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    engine.dispose()  # connections opened while the storage set itself up get the setting when opened again
