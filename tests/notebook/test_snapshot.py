"""The kernel side of "release keeps the variables" (trainhub.kernels.snapshot): save a namespace,
load it back, and say what could not be kept. A real IPython shell, then a real ipykernel."""

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
