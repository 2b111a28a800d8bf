"""The kernel side of "release keeps the variables" (trainhub.kernels.snapshot): save a namespace,
load it back, and say what could not be kept. A real IPython shell, then a real ipykernel moved five times."""

from __future__ import annotations

import json
import os
import time

import pytest

from trainhub import snapshots
from trainhub.kernels import snapshot


def env_for(folder, notebook="work/nb.ipynb", root=None):
    e = {snapshots.DIR_VAR: str(folder), snapshots.SESSION_VAR: notebook}
    if root:
        e[snapshots.ROOT_VAR] = str(root)
    return e


def test_save_and_restore_in_a_shell(shell, tmp_path):
    env = env_for(tmp_path / "snaps")
    log = open(tmp_path / "log.txt", "w")
    shell.run_cell(
        "import json as js\n"
        "n = 42\n"
        "d = {'a': [1, 2], 'b': {'c': 'x'}}\n"
        "base = 10\n"
        "def make():\n"
        "    k = 5\n"
        "    return lambda x: x + k + base\n"
        "add = make()\n"
        "sq = lambda x: x * x\n"
        "class Point:\n"
        "    def __init__(self, x): self.x = x\n"
        "p = Point(3)\n"
        "gen = (i for i in range(3))\n"
        "import threading; lk = threading.Lock()\n"
        "shared = [1]; pair = (shared, shared)\n"
    )
    shell.user_ns["fh"] = log
    shell.user_ns["_private"] = 1
    manifest = json.loads(snapshot.save_for_session(shell, env))
    assert manifest["notebook"] == "work/nb.ipynb"
    assert set(manifest["kept"]) >= {"n", "d", "add", "sq", "Point", "p", "js", "base", "pair", "shared", "make"}
    assert manifest["not_kept"] == {
        "gen": "generator (run the cell that makes it again)",
        "fh": "open file (open it again)",
        "lk": "lock",
    }
    assert "_private" not in manifest["kept"] and "In" not in manifest["kept"]
    folder = tmp_path / "snaps"
    key = snapshots.key_for("work/nb.ipynb")
    assert sorted(p.name for p in folder.iterdir()) == [f"{key}.json", f"{key}.pkl"]
    assert oct((folder / f"{key}.pkl").stat().st_mode & 0o777) == "0o600"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"

    shell.reset(new_session=True)
    assert "n" not in shell.user_ns
    text = snapshot.restore_at_start(shell, env)
    ns = shell.user_ns
    assert ns["n"] == 42 and ns["d"] == {"a": [1, 2], "b": {"c": "x"}}
    assert ns["add"](1) == 16 and ns["sq"](4) == 16 and ns["p"].x == 3 and ns["js"].dumps([1]) == "[1]"
    assert ns["pair"][0] is ns["pair"][1]  # shared objects stay shared
    assert "gen" not in ns and "fh" not in ns
    assert "your variables were restored" in text and "not kept: gen (generator" in text
    assert "not kept: fh (open file" in text and "not kept: lk (lock)" in text
    assert list(folder.iterdir()) == []  # restored once: the snapshot is gone
    assert snapshot.restore_at_start(shell, env) is None
    log.close()


def test_the_note_is_printed_by_the_first_cell_only(shell, tmp_path, capsys):
    env = env_for(tmp_path, notebook=str(tmp_path / "root" / "a.ipynb"), root=tmp_path / "root")
    shell.user_ns["x"] = 1
    m = json.loads(snapshot.save_for_session(shell, env))
    assert m["notebook"] == "a.ipynb"  # an absolute session name is made relative to the server's root
    shell.reset(new_session=True)
    snapshot.restore_at_start(shell, env)
    capsys.readouterr()
    shell.run_cell("y = x + 1")
    first = capsys.readouterr().out
    shell.run_cell("z = 3")
    assert "restored: x" in first and capsys.readouterr().out == ""
    assert shell.user_ns["_trainhub_restored"]["restored"] == ["x"]


def test_numpy_arrays(shell, tmp_path):
    np = pytest.importorskip("numpy")
    env = env_for(tmp_path)
    shell.user_ns["arr"] = np.arange(12).reshape(3, 4)
    snapshot.save_for_session(shell, env)
    shell.reset(new_session=True)
    snapshot.restore_at_start(shell, env)
    assert (shell.user_ns["arr"] == np.arange(12).reshape(3, 4)).all()


def test_torch_model_and_optimizer_keep_sharing_parameters(shell, tmp_path):
    torch = pytest.importorskip("torch")
    env = env_for(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shell.user_ns.update(model=model, opt=opt, t=torch.ones(2, requires_grad=True))
    snapshot.save_for_session(shell, env)
    shell.reset(new_session=True)
    snapshot.restore_at_start(shell, env)
    m2, o2 = shell.user_ns["model"], shell.user_ns["opt"]
    assert torch.equal(m2.weight, model.weight) and shell.user_ns["t"].requires_grad
    assert o2.param_groups[0]["params"][0] is m2.weight  # the optimizer still steps the restored model


def test_expired_snapshots_are_deleted_when_a_kernel_looks(shell, tmp_path):
    env = env_for(tmp_path, notebook="old.ipynb")
    shell.user_ns["x"] = 1
    snapshot.save_for_session(shell, env)
    old = time.time() - snapshots.DEFAULT_MAX_AGE - 60
    for p in tmp_path.iterdir():
        os.utime(p, (old, old))
    shell.reset(new_session=True)
    assert snapshot.restore_at_start(shell, env) is None
    assert list(tmp_path.iterdir()) == [] and "x" not in shell.user_ns


def test_a_kernel_of_no_notebook_is_skipped(shell):
    assert json.loads(snapshot.save_for_session(shell, {})) == {"skipped": "the kernel belongs to no notebook"}


def test_moving_onto_gpus_restores_tensors_on_the_cpu_and_says_so(shell, tmp_path):
    """The reverse move (CPU server -> GPU server): the snapshot does not record devices, so tensors come
    back on the CPU, and a kernel with GPUs names them in the note."""
    torch = pytest.importorskip("torch")
    env = env_for(tmp_path)
    shell.user_ns.update(model=torch.nn.Linear(2, 2), t=torch.zeros(3), n=1)
    manifest = json.loads(snapshot.save_for_session(shell, env))
    assert manifest["tensors"] == ["model", "t"] and manifest["moved_to_cpu"] == []
    shell.reset(new_session=True)
    text = snapshot.restore_at_start(shell, {**env, "CUDA_VISIBLE_DEVICES": "1"})
    assert "on the CPU (move them to the GPU with .to('cuda')): model, t" in text, text
    assert shell.user_ns["t"].device.type == "cpu"


def test_the_note_names_tensors_on_the_cpu_only_in_a_kernel_with_gpus():
    manifest = {"tensors": ["model", "t"], "moved_to_cpu": ["model"], "not_kept": {}}
    on_gpu = snapshot.note(manifest, ["model", "n", "t"], gpus=True)
    assert "on the CPU (move them to the GPU with .to('cuda')): model, t" in on_gpu and "now on the CPU" not in on_gpu
    on_cpu = snapshot.note(manifest, ["model", "n", "t"], gpus=False)
    assert "now on the CPU: model" in on_cpu and "move them to the GPU" not in on_cpu
    # a snapshot from before "tensors" was recorded: the names moved to the CPU
    assert "): model" in snapshot.note({"moved_to_cpu": ["model"]}, ["model"], gpus=True)
    # nothing restored, nothing to move
    assert "move them" not in snapshot.note(manifest, ["n"], gpus=True)
    assert snapshot.has_gpus({"CUDA_VISIBLE_DEVICES": "0,1"})
    for visible in ("", "-1", "void", " "):
        assert not snapshot.has_gpus({"CUDA_VISIBLE_DEVICES": visible})
    assert not snapshot.has_gpus({})


# -- a real kernel, started as a server starts it, moved again and again --------------------------------------

MOVE_VALUES = """
import numpy as np
import torch
n = 42
s = "text"
f = 2.5
items = [1, [2, 3], "x"]
d = {"a": 1, "b": [1, 2]}
arr = np.arange(6).reshape(2, 3)
t = torch.arange(4.0)
class Point:
    def __init__(self, x):
        self.x = x
    def double(self):
        return self.x * 2
p = Point(21)
def twice(x):
    return 2 * x
sq = lambda x: x * x
"""
MOVE_CHECK = ("print('check', n, s, f, items, d, arr.sum(), float(t.sum()), p.double(), type(p).__name__, "
              "twice(4), sq(5))")
MOVE_EXPECTED = "check 42 text 2.5 [1, [2, 3], 'x'] {'a': 1, 'b': [1, 2]} 15 6.0 42 Point 8 25"
WHO = ["Point", "arr", "d", "f", "items", "n", "np", "p", "s", "sq", "t", "torch", "twice"]


class _Kernel:
    """An ipykernel started as a notebook server starts a notebook's kernel (the platform's startup file in its
    IPython directory, the snapshot folder and the notebook's session name in its environment)."""

    def __init__(self, env):
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, silent=False, user_expressions=None, timeout=120) -> tuple[str, dict]:
        msg_id = self.kc.execute(code, silent=silent, store_history=not silent, user_expressions=user_expressions or {})
        out = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        reply = self.kc.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=timeout)
        return "".join(out), reply["content"]

    def who(self) -> tuple[list[str], str]:
        """The names ``%who`` lists (``%who_ls``: the same list, as a value), and the cell's whole output."""
        out, _ = self.run("print('WHO', *get_ipython().run_line_magic('who_ls', ''))")
        return next(line.split()[1:] for line in out.splitlines() if line.startswith("WHO")), out

    def snapshot(self) -> dict:
        """What the server extension does before a move (trainhub.extensions.storage.snapshot)."""
        import ast

        from trainhub.extensions.storage.snapshot import SAVE_EXPRESSION

        _, reply = self.run("", silent=True, user_expressions={"snapshot": SAVE_EXPRESSION})
        result = reply["user_expressions"]["snapshot"]
        assert result["status"] == "ok", result
        return json.loads(ast.literal_eval(result["data"]["text/plain"]))

    def stop(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def test_variables_survive_five_moves_in_a_real_kernel(tmp_path):
    """A move is: the kernel saves its variables, the server stops, a new kernel starts for the notebook and
    restores them. Every kind of picklable value survives five moves, and `%who` lists them after each, also
    when the next move comes before any cell ran (IPython hides whatever the start-up files define)."""
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    from trainhub.kernels.startup import install_ipython_startup

    home = tmp_path / "home"
    home.mkdir()
    install_ipython_startup(home)  # writes <home>/.ipython/profile_default/startup/00-trainhub.py
    env = dict(os.environ, HOME=str(home), IPYTHONDIR=str(home / ".ipython"), **env_for(tmp_path / "snaps"))
    env.pop("TRAINHUB_API_URL", None)
    kernel = _Kernel(env)
    try:
        kernel.run(MOVE_VALUES)
        assert kernel.who()[0] == WHO
        for move in range(1, 6):
            manifest = kernel.snapshot()
            assert sorted(manifest["kept"]) == WHO and manifest["not_kept"] == {}, (move, manifest)
            kernel.stop()
            kernel = _Kernel(env)
            if move == 2:  # the next move before any cell ran in this kernel
                continue
            names, first = kernel.who()
            assert names == WHO, (move, first)
            assert "your variables were restored" in first, first  # the note, on the first cell run
            out, _ = kernel.run(MOVE_CHECK)
            assert MOVE_EXPECTED in out, (move, out)
    finally:
        kernel.stop()
