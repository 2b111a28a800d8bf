"""Keep a kernel's variables across a release: save the user namespace, load it back in the next kernel.

Before a server is restarted on another profile (the culler's ``release``, the user's "give my GPU
back", and the reverse move, "get a GPU again"), the server extension runs :func:`save` in each notebook's kernel. When a kernel is next
started for the same notebook (``$JPY_SESSION_NAME``, set by jupyter-server), the IPython startup
file loads this module as an extension and :func:`restore_at_start` loads the variables back once;
the first cell run then prints a short note of what was restored and what could not be kept.

What is kept: every value cloudpickle can pickle (lambdas, closures and classes defined in the
notebook included; importable modules are imported again). torch tensors (and so models and
optimizers) are copied to the CPU while pickling (the running kernel's own objects are not moved),
and values that share objects (a model and its optimizer) are pickled together, so they still share
them. The snapshot does not record a tensor's device, so after a move onto GPUs tensors are restored on
the CPU too; the note names them (``.to('cuda')`` moves them). What is not: open files, generators, locks, sockets, CUDA streams and anything else pickle
refuses, each listed with the reason.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import threading
import time
import types
from pathlib import Path

from trainhub import snapshots

#: IPython's own names in the user namespace, never saved
SKIP = {"In", "Out", "exit", "quit", "get_ipython"}
_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


class _NullWriter(io.RawIOBase):
    """Counts bytes: a pickling trial that keeps nothing in memory."""

    def __init__(self):
        self.n = 0

    def writable(self):
        return True

    def write(self, b):
        self.n += len(b)
        return len(b)


def _pickler_class():
    import cloudpickle

    class CPUPickler(cloudpickle.Pickler):
        """cloudpickle, with torch tensors on another device pickled as CPU copies."""

        def reducer_override(self, obj):
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
                cpu = obj.detach().to("cpu")
                if isinstance(obj, torch.nn.Parameter):
                    cpu = torch.nn.Parameter(cpu, requires_grad=obj.requires_grad)
                elif obj.requires_grad:
                    cpu.requires_grad_(True)
                return cpu.__reduce_ex__(self.proto)  # memoized as ``obj``: shared tensors stay shared
            return super().reducer_override(obj)

    return CPUPickler


def _dump(value, f) -> None:
    _pickler_class()(f, protocol=pickle.HIGHEST_PROTOCOL).dump(value)


def why_not(value, error: BaseException | None = None) -> str:
    """Why ``value`` cannot be kept, in a few words."""
    if isinstance(value, io.IOBase) or type(value).__name__ in ("TextIOWrapper", "BufferedReader", "BufferedWriter"):
        return "open file (open it again)"
    if isinstance(value, (types.GeneratorType, types.AsyncGeneratorType)):
        return "generator (run the cell that makes it again)"
    if isinstance(value, types.CoroutineType):
        return "coroutine"
    if isinstance(value, _LOCK_TYPES):
        return "lock"
    if isinstance(value, types.ModuleType):
        return "module that cannot be imported again (import it again)"
    name = type(value).__name__
    if "socket" in name.lower():
        return "socket (connect again)"
    if "Stream" in name and "cuda" in type(value).__module__:
        return "CUDA stream"
    if error is not None:
        return f"{type(error).__name__}: {str(error)[:200]}"
    return f"{name} cannot be pickled"


#: the namespace entry that records a restore (the note, the names restored, what was not kept)
RESTORED = "_trainhub_restored"


def user_variables(shell) -> dict:
    """The user's variables, as ``%who`` lists them (no IPython names, no names starting with _).

    The variables a restore put back count as the user's even while IPython still hides them: a kernel
    hides everything in its namespace once its start-up files have run (``InteractiveShellApp.hide_initial_ns``),
    the restored variables included, until :func:`_unhide` runs before the first execution. A snapshot taken
    before that (a second move with no cell run in between) keeps them all the same.
    """
    hidden = getattr(shell, "user_ns_hidden", {})
    restored = set((shell.user_ns.get(RESTORED) or {}).get("restored") or ())
    out = {}
    for name, value in shell.user_ns.items():
        if name.startswith("_") or name in SKIP:
            continue
        if name in hidden and hidden[name] is value and name not in restored:
            continue
        out[name] = value
    return out


def save(shell, data_path: str | os.PathLike, manifest_path: str | os.PathLike, notebook: str = "") -> dict:
    """Pickle the user's variables into ``data_path``; write and return the manifest.

    All the values that can be kept are pickled together (shared objects stay shared); which those
    are is only worked out one by one when pickling them together fails.
    """
    started = time.monotonic()
    variables = user_variables(shell)
    not_kept: dict[str, str] = {}
    try:
        _dump(variables, _NullWriter())
    except Exception:
        for name, value in list(variables.items()):
            if isinstance(value, (types.GeneratorType, io.IOBase) + _LOCK_TYPES):
                not_kept[name] = why_not(value)
                del variables[name]
                continue
            try:
                _dump(value, _NullWriter())
            except Exception as e:  # anything pickle refuses
                not_kept[name] = why_not(value, e)
                del variables[name]
    data_path = Path(data_path)
    snapshots.ensure_dir(data_path.parent)
    tmp = data_path.with_name(f".{data_path.name}.{os.getpid()}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            _dump(variables, f)
        os.replace(tmp, data_path)
    finally:
        if tmp.exists():
            tmp.unlink()
    torch = sys.modules.get("torch")
    moved, tensors = [], []
    if torch is not None:
        moved = sorted(n for n, v in variables.items() if _on_device(torch, v))
        tensors = sorted(n for n, v in variables.items() if isinstance(v, (torch.Tensor, torch.nn.Module)))
    manifest = {
        "notebook": notebook, "saved_at": time.time(), "kept": sorted(variables), "not_kept": not_kept,
        "moved_to_cpu": moved, "tensors": tensors, "bytes": data_path.stat().st_size,
        "seconds": round(time.monotonic() - started, 3), "pid": os.getpid(),
    }
    snapshots.write_manifest(manifest_path, manifest)
    return manifest


def _on_device(torch, value) -> bool:
    """A tensor or module that was not on the CPU (what the note calls "moved to the CPU")."""
    try:
        if isinstance(value, torch.Tensor):
            return value.device.type not in ("cpu", "meta")
        if isinstance(value, torch.nn.Module):
            return any(p.device.type not in ("cpu", "meta") for p in value.parameters())
    except Exception:
        return False
    return False


def save_for_session(shell, environ=os.environ) -> str:
    """What the server extension evaluates in each kernel: :func:`save` under this kernel's notebook.

    Returns the manifest as JSON (the server reads it from the execute reply); ``{"skipped": why}``
    for a kernel that belongs to no notebook.
    """
    import json

    where = snapshots.kernel_notebook(environ)
    if where is None:
        return json.dumps({"skipped": "the kernel belongs to no notebook"})
    folder, notebook = where
    return json.dumps(save(shell, snapshots.data_path(folder, notebook), snapshots.manifest_path(folder, notebook),
                           notebook), default=str)


def has_gpus(environ=os.environ) -> bool:
    """The kernel was given GPUs (``$CUDA_VISIBLE_DEVICES`` names some: a GPU profile's server)."""
    visible = (environ.get("CUDA_VISIBLE_DEVICES") or "").strip()
    return bool(visible) and visible not in ("-1", "none", "void", "NoDevFiles")


def note(manifest: dict, restored: list[str], failed: str | None = None, gpus: bool = False) -> str:
    """The text shown in the notebook after a restore (``gpus``: the restoring kernel has GPUs).

    Tensors are restored on the CPU whichever way the server moved: the snapshot pickles CPU copies and
    does not record the device a tensor was on. On a GPU server the note names them, to move back.
    """
    lines = []
    if failed:
        lines.append(f"trainhub: your variables could not be restored after the server restarted ({failed}).")
    else:
        names = ", ".join(restored) if restored else "(none)"
        lines.append(f"trainhub: the server restarted on another profile; your variables were restored: {names}.")
        if gpus:
            on_cpu = [n for n in manifest.get("tensors") or manifest.get("moved_to_cpu") or [] if n in restored]
            if on_cpu:
                lines.append(f"  on the CPU (move them to the GPU with .to('cuda')): {', '.join(on_cpu)}")
        elif manifest.get("moved_to_cpu"):
            lines.append(f"  now on the CPU: {', '.join(manifest['moved_to_cpu'])}")
    for name, why in sorted((manifest.get("not_kept") or {}).items()):
        lines.append(f"  not kept: {name} ({why})")
    return "\n".join(lines)


def restore(shell, data_path: str | os.PathLike, manifest_path: str | os.PathLike) -> tuple[dict, list[str], str | None]:
    """Load a snapshot into ``shell`` once (the files are claimed, then deleted); (manifest, names, error)."""
    data_path, manifest_path = Path(data_path), Path(manifest_path)
    claim = data_path.with_name(f".{data_path.name}.{os.getpid()}.claim")
    try:
        os.rename(data_path, claim)  # one kernel only, if two start for the same notebook
    except FileNotFoundError:
        return {}, [], None
    manifest = snapshots.read_manifest(manifest_path) or {}
    try:
        manifest_path.unlink()
    except FileNotFoundError:
        pass
    try:
        import cloudpickle  # noqa: F401  (pickles may name its functions)

        with open(claim, "rb") as f:
            variables = pickle.load(f)
    except Exception as e:
        return manifest, [], f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        claim.unlink()
    shell.user_ns.update(variables)
    return manifest, sorted(variables), None


def restore_at_start(shell, environ=os.environ) -> str | None:
    """In a new kernel for a notebook: drop expired snapshots, restore this notebook's, note it once.

    Returns the note (None when there was nothing to restore). The note is printed before the
    first cell runs (output at kernel start reaches no notebook) and kept as ``_trainhub_restored``.
    """
    where = snapshots.kernel_notebook(environ)
    if where is None:
        return None
    folder, notebook = where
    snapshots.clean_expired(folder, snapshots.max_age(environ))
    manifest, names, error = restore(shell, snapshots.data_path(folder, notebook), snapshots.manifest_path(folder, notebook))
    if not manifest and not names and not error:
        return None
    text = note(manifest, names, error, gpus=has_gpus(environ))
    shell.user_ns[RESTORED] = {"note": text, "restored": names, "not_kept": manifest.get("not_kept", {}), "error": error}
    _unhide_before_first_execution(shell, names)
    _show_once(shell, text)
    return text


def _unhide_before_first_execution(shell, names: list[str]) -> None:
    """``%who``, ``%whos`` and the variable inspectors list the restored variables again.

    The start-up files run before the kernel hides its initial namespace (``hide_initial_ns``), so the
    restored names are hidden right after this module restores them; they are taken out of
    ``user_ns_hidden`` again before the first execution (silent ones included), once."""
    def unhide(*args):
        shell.events.unregister("pre_execute", unhide)
        hidden = getattr(shell, "user_ns_hidden", None)
        if hidden is None:
            return
        for name in names:
            if name in hidden and hidden[name] is shell.user_ns.get(name, _MISSING):
                del hidden[name]

    shell.events.register("pre_execute", unhide)


_MISSING = object()


def _show_once(shell, text: str) -> None:
    def show(*args):
        shell.events.unregister("pre_run_cell", show)
        print(text, flush=True)

    shell.events.register("pre_run_cell", show)


def load_ipython_extension(ipython):
    """``%load_ext trainhub.kernels.snapshot`` (the startup file does it): restore this notebook's variables."""
    try:
        restore_at_start(ipython)
    except Exception as e:  # never break the kernel
        print(f"trainhub: could not restore this notebook's variables ({type(e).__name__}: {e})", file=sys.stderr)
