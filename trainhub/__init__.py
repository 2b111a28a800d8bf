"""trainhub: a JupyterHub-based notebook platform for deep-learning teams.

The core package holds what every part shares (settings, state, GPU pool, storage, the jobs
vocabulary); the design card's folders import beside it as ``trainhub.spawner``,
``trainhub.kernels``, ``trainhub.extensions``, ``trainhub.hub_config`` and
``trainhub.services``. Layers, highest first: the CLI (``trainhub.cli``, ``trainhub.commands``),
the composition root (``trainhub.app``, ``trainhub.hub_config``), the independent parts, the
core; a module imports only its own layer and those below (docs/architecture.md).
"""

__version__ = "0.1.0"

# The in-job API, re-exported lazily (no import-time work): trainhub.log_metrics(step=1, loss=0.5),
# trainhub.save_checkpoint(state, step), trainhub.resume(); and @trainhub.remote (trainhub.remotejob)
_RUNTIME_EXPORTS = ("log_metrics", "report", "params", "outputs_dir", "tensorboard_dir", "save_checkpoint", "load_checkpoint",
                    "checkpoints", "resume", "attempt", "optuna_storage")
_REMOTE_EXPORTS = ("remote",)


def __getattr__(name):
    if name in _RUNTIME_EXPORTS:
        from trainhub import runtime

        return getattr(runtime, name)
    if name in _REMOTE_EXPORTS:
        from trainhub import remotejob

        return getattr(remotejob, name)
    raise AttributeError(f"module 'trainhub' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_RUNTIME_EXPORTS) + list(_REMOTE_EXPORTS))
