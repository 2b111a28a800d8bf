"""Values back from jobs in a real IPython shell: ``%%train --return``, ``job.result()``, ``%train result``
after a restart, and ``@trainhub.remote`` defined in cells, against the jobs-API contract stand-in (jobs
run as real subprocesses; their storage area is their folder, as ``outputs_url`` says).

The end-to-end versions (a real ``trainhub up``, kernels in a spawned server) are in
tests/notebook/test_round_trip_e2e.py.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from trainhub.client import TrainhubClient
from trainhub.handle import JobFailedError

import jobs_contract_server


@pytest.fixture(scope="module")
def _server():
    server = jobs_contract_server.ServerThread()
    yield server
    server.stop()


@pytest.fixture
def magics(shell, _server, monkeypatch, tmp_path):
    _server.service.reset()
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    monkeypatch.chdir(tmp_path)  # the notebook's folder, which %%train sends along
    m = shell.magics_manager.registry["TrainMagics"]
    m.client = TrainhubClient(_server.url, _server.token, retries=1, backoff=0.01)
    m.poll_interval = 0.05
    yield m
    m.client = None
    _server.service.reset()


def run(shell, source: str):
    """Run a cell as the notebook would (in history, so later %%train cells see its definitions)."""
    r = shell.run_cell(source, store_history=True)
    if r.error_before_exec or r.error_in_exec:
        raise r.error_before_exec or r.error_in_exec
    return r.result


def test_return_with_wait_sets_the_values_in_the_notebook(shell, magics, capsys):
    run(shell, "def make(n):\n    return {'w': list(range(n))}\n")
    magics.train("--wait --return acc,model", "acc = 0.25 * 4\nmodel = make(3)\nunrelated = 1\n")
    assert shell.user_ns["acc"] == 1.0 and shell.user_ns["model"] == {"w": [0, 1, 2]}
    assert "unrelated" not in shell.user_ns
    out, err = capsys.readouterr()
    # information, not an error: stdout (a notebook shows stderr as a red box)
    assert "%train: set acc, model from j-" in out and "%train" not in err


def test_result_waits_and_survives_a_kernel_restart(shell, magics, capsys):
    handle = magics.train("--as job --return loss", "import time\ntime.sleep(0.5)\nloss = [0.5, 0.25]\n")
    assert handle.result(timeout=60) == {"loss": [0.5, 0.25]}
    job_id = handle.id
    shell.reset(new_session=True)  # what a kernel restart leaves: no handle, no variables
    assert "loss" not in shell.user_ns
    magics.train(f"result {job_id}")
    assert shell.user_ns["loss"] == [0.5, 0.25]
    magics.train(f"result {job_id} --as out")
    assert shell.user_ns["out"] == {"loss": [0.5, 0.25]}
    out, err = capsys.readouterr()
    assert f"%train: set loss from {job_id}" in out and f"%train: out = the values {job_id} sent back (loss)" in out
    assert "%train" not in err


def test_return_of_a_name_the_cell_never_assigns_submits_nothing(shell, magics):
    with pytest.raises(UsageError, match=r"--return modle: the cell never assigns it .*nothing was submitted"):
        magics.train("--return model,modle", "model = 1\n")
    with pytest.raises(UsageError, match=r"expected Python names separated by commas"):
        magics.train("--return 1x", "x = 1\n")
    assert magics.client.list()["total"] == 0


def test_a_value_that_cannot_be_sent_fails_the_job_and_is_named(shell, magics):
    with pytest.raises(JobFailedError) as e:
        magics.train("--wait --return lock,n", "import threading\nlock = threading.Lock()\nn = 2\n")
    text = str(e.value)
    assert "failed" in text and "could not send back lock:" in text
    assert "lock: cannot be pickled (TypeError: cannot pickle '_thread.lock' object)" in text


def test_result_of_a_job_that_returned_nothing_says_how(shell, magics):
    handle = magics.train("--as job", "x = 1\n")
    from trainhub.results import ResultsError

    with pytest.raises(ResultsError, match=r"sent no values back: submit with `%%train --return NAME`"):
        handle.result(timeout=60)
    with pytest.raises(UsageError, match="sent no values back"):
        magics.train(f"result {handle.id}")


def test_dry_run_shows_what_is_sent_back(shell, magics, capsys):
    magics.train("--dry-run --return a,b", "a = 1\nb = 2\n")
    out = capsys.readouterr().out
    assert "_th_results.send_names(globals(), ['a', 'b'])" in out
    assert out.index("a = 1") < out.index("send_names")


def test_remote_function_defined_in_cells_runs_as_a_job(shell, magics):
    run(shell, "import trainhub\nimport json as js\nSCALE = 3\n")
    run(shell, "class Point:\n    def __init__(self, x):\n        self.x = x\n")
    run(shell, "def helper(p):\n    return Point(p.x * SCALE)\n")
    run(shell, "@trainhub.remote(workers=1, name='remote-test')\ndef work(p, k=1):\n    return js.dumps({'x': helper(p).x * k})\n")
    shell.user_ns["work"].client = magics.client
    assert run(shell, "work(Point(2), k=10)") == '{"x": 60}'
    call = run(shell, "work.submit(Point(1))")
    assert call.result(timeout=60) == '{"x": 3}'
    job = magics.client.get(call.id)
    assert job["name"] == "remote-test" and "@trainhub.remote(" not in job["script"] and "def helper" in job["script"]
    assert run(shell, "work.local(Point(1), k=2)") == '{"x": 6}'


def test_remote_function_that_raises_fails_with_its_traceback(shell, magics):
    run(shell, "import trainhub\n@trainhub.remote\ndef boom():\n    raise ValueError('no good')\n")
    shell.user_ns["boom"].client = magics.client
    with pytest.raises(JobFailedError, match=r"(?s)failed.*ValueError: no good"):
        shell.user_ns["boom"]()
