"""Values back from jobs, end to end: kernels in a user's spawned server (a real `trainhub up`, the shared
``platform``), jobs through the real jobs service, values through the user's storage area.

- ``%%train --wait --return``: the values are set in the notebook (a 30 MB one too);
- ``--return`` without ``--wait``: ``job.result()`` waits; after the kernel is gone (a new kernel),
  ``%train result ID`` sets them again; a torch module comes back on the CPU;
- ``@trainhub.remote`` defined in cells: a call returns the value, ``.submit().result()`` too.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

USER = "rt-notebook"

FIRST_KERNEL = r'''
ip = get_ipython()
ip.run_cell("import trainhub\ndef make(n):\n    return list(range(n))\n", store_history=True)
ip.run_cell_magic("train", "--wait --return acc,big --name rt-wait", "acc = sum(make(5)) / 10\nbig = bytes(30_000_000)\n")
print("ACC", acc, len(big))
h = ip.run_cell_magic("train", "--as job --return model,steps --name rt-later",
                      "import torch\nmodel = torch.nn.Linear(2, 3)\nsteps = 5\n")
print("JOB", h.id)
print("RESULT", sorted(h.result(timeout=240)))
'''

SECOND_KERNEL = r'''
get_ipython().run_line_magic("train", "result {job}")
print("MODEL", type(model).__name__, model.weight.device, tuple(model.weight.shape), steps)
'''

REMOTE_KERNEL = r'''
ip = get_ipython()
ip.run_cell("import trainhub\nBASE = 40\n", store_history=True)
ip.run_cell("class Box:\n    def __init__(self, v):\n        self.v = v\n", store_history=True)
ip.run_cell("@trainhub.remote(name='rt-remote')\ndef add(box, k=0):\n    import os\n"
            "    return {'v': box.v + BASE + k, 'job': os.environ['TRAINHUB_JOB_ID']}\n", store_history=True)
print("CALL", ip.run_cell("add(Box(1), k=1)").result)
call = ip.run_cell("add.submit(Box(2))").result
print("SUBMIT", call.id, call.result(timeout=240))
'''


@pytest.fixture(scope="module")
def server(platform):
    platform.spawn(USER, "cpu", timeout=180)
    yield platform
    platform.stop_server(USER)


def test_return_sets_values_and_result_survives_a_kernel_restart(server):
    out = server.kernel_exec(USER, FIRST_KERNEL, timeout=300)
    assert "ACC 1.0 30000000" in out, out
    assert "RESULT ['model', 'steps']" in out, out
    job_id = out.split("JOB ", 1)[1].split()[0]
    # a new kernel: nothing of the first one is left but the job
    out2 = server.kernel_exec(USER, SECOND_KERNEL.format(job=job_id), timeout=120)
    assert "MODEL Linear cpu (3, 2) 5" in out2, out2
    assert f"%train: set model, steps from {job_id}" in out2 or "set model, steps" in out2


def test_remote_function_returns_its_value(server):
    pytest.importorskip("ipykernel")
    out = server.kernel_exec(USER, REMOTE_KERNEL, timeout=300)
    call_line = next(line for line in out.splitlines() if line.startswith("CALL"))
    assert "'v': 42" in call_line, out
    submit = next(line for line in out.splitlines() if line.startswith("SUBMIT")).split()
    assert submit[1].startswith("j-") and "'v': 42" in " ".join(submit[2:]) and f"'job': '{submit[1]}'" in " ".join(submit[2:])
