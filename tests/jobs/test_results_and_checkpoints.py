"""The job's storage area (trainhub.jobarea): values sent back (trainhub.results) and checkpoints
(trainhub.runtime), on a local folder and on a real S3 (moto_server), as a job and its caller see them.

Each test plays a job by setting the variables the engine gives every worker (``TRAINHUB_JOB_ID``,
``TRAINHUB_JOB_URL``, ``TRAINHUB_JOB_ATTEMPT``, ``RANK``, ``TRAINHUB_STORAGE_OPTIONS``), and the caller
by reading through the job as the API describes it (``outputs_url``, ``attempt``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from trainhub import jobarea, results, runtime
from trainhub.results import ResultsError


@pytest.fixture(params=["local", "s3"])
def area_url(request, tmp_path, monkeypatch):
    """The URL of a fresh job area, with the job's environment set (local folder or S3)."""
    if request.param == "local":
        url = str(tmp_path / "storage" / "users" / "ann" / "jobs" / "j-000042")
        monkeypatch.setenv("TRAINHUB_STORAGE_OPTIONS", "{}")
    else:
        s3 = request.getfixturevalue("s3_server")
        bucket = s3.make_bucket()
        url = f"s3://{bucket}/users/ann/jobs/j-000042"
        monkeypatch.setenv("TRAINHUB_STORAGE_OPTIONS", json.dumps({"endpoint_url": s3.endpoint, "key": s3.key,
                                                                   "secret": s3.secret}))
    monkeypatch.setenv("TRAINHUB_JOB_ID", "j-000042")
    monkeypatch.setenv("TRAINHUB_JOB_URL", url)
    monkeypatch.setenv("TRAINHUB_JOB_ATTEMPT", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("TRAINHUB_RESUME_URL", raising=False)
    monkeypatch.delenv("TRAINHUB_RESUME_STEP", raising=False)
    return url


def as_api(url, attempt=1, state="succeeded"):
    return {"id": "j-000042", "state": state, "attempt": attempt, "outputs_url": url}


# -- results ------------------------------------------------------------------------------------------
def test_values_round_trip_big_ones_too(area_url):
    big = os.urandom(24 * 1024 * 1024)  # over fsspec's and s3fs's block sizes: a multi-part write
    manifest = results.send({"acc": 0.93, "cfg": {"lr": [0.1, 0.01]}, "blob": big})
    assert manifest["errors"] == {} and set(manifest["values"]) == {"acc", "cfg", "blob"}
    assert manifest["values"]["blob"]["format"] == "bytes" and manifest["values"]["blob"]["bytes"] == len(big)
    back = results.load(as_api(area_url))
    assert back["acc"] == 0.93 and back["cfg"] == {"lr": [0.1, 0.01]} and back["blob"] == big
    area = jobarea.Area(area_url)
    assert not [n for n in area.names("results") if n.endswith(".tmp") or n.startswith(".")]  # no temporary file left


def test_a_value_that_cannot_be_sent_is_named_the_others_still_come_back_and_the_job_fails(area_url):
    with pytest.raises(SystemExit) as e:
        results.send({"model": [1, 2], "lock": threading.Lock(), "gen": (x for x in ())})
    text = str(e.value)
    assert text.startswith("trainhub: could not send back gen, lock:")
    assert "  - lock: cannot be pickled (TypeError: cannot pickle '_thread.lock' object)" in text
    assert "(sent: model)" in text
    with pytest.raises(ResultsError) as e:
        results.load(as_api(area_url))
    assert set(e.value.errors) == {"lock", "gen"} and e.value.values == {"model": [1, 2]}
    assert "lock: cannot be pickled (TypeError" in str(e.value)


def test_names_the_code_never_bound_are_reported(area_url):
    with pytest.raises(SystemExit, match="  - missing: not defined when the code finished"):
        results.send_names({"x": 1}, ["x", "missing"])
    with pytest.raises(ResultsError) as e:
        results.load(as_api(area_url))
    assert e.value.values == {"x": 1}


def test_no_values_and_an_older_attempts_values_are_refused_with_the_reason(area_url, monkeypatch):
    with pytest.raises(ResultsError, match=r"j-000042 sent no values back: submit with `%%train --return NAME`"):
        results.load(as_api(area_url))
    results.send({"x": 1})
    with pytest.raises(ResultsError, match=r"are from attempt 1 of j-000042; its last attempt \(2\) sent none"):
        results.load(as_api(area_url, attempt=2))
    monkeypatch.setenv("TRAINHUB_JOB_ATTEMPT", "2")
    results.send({"x": 2})
    assert results.load(as_api(area_url, attempt=2)) == {"x": 2}


def test_only_rank_0_sends(area_url, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert results.send({"x": 1}) is None
    with pytest.raises(ResultsError, match="sent no values back"):
        results.load(as_api(area_url))


def test_unreadable_storage_says_where_values_are_read_from(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINHUB_STORAGE_OPTIONS", json.dumps({"endpoint_url": "http://127.0.0.1:9", "key": "k",
                                                               "secret": "s"}))
    with pytest.raises(ResultsError, match=r"cannot read the storage area of j-000042 \(s3://nope/x\).*"
                       r"\$TRAINHUB_STORAGE_OPTIONS gives access"):
        results.load(as_api("s3://nope/x"))


def test_a_value_of_a_class_the_job_defined_needs_that_class_here(tmp_path, monkeypatch):
    """The job's script is __main__: an instance of a class its cell defined cannot be unpickled where that
    class does not exist; the error says what to do instead."""
    area = tmp_path / "area"
    script = tmp_path / "job.py"
    script.write_text("import trainhub.results as r\nclass Net:\n    pass\nr.send({'net': Net(), 'n': 3})\n")
    env = dict(os.environ, TRAINHUB_JOB_ID="j-000042", TRAINHUB_JOB_URL=str(area), TRAINHUB_STORAGE_OPTIONS="{}",
               TRAINHUB_JOB_ATTEMPT="1", RANK="0")
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    with pytest.raises(ResultsError) as e:
        results.load(as_api(str(area)), namespace={})
    assert "net: a __main__.Net whose class or function Net the job defined itself: define Net here first" in str(e.value)
    assert e.value.values == {"n": 3}

    class Net:  # defined "here" (in __main__, as a notebook cell does): now it loads
        pass
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "Net", Net, raising=False)
    back = results.load(as_api(str(area)), namespace=vars(main))
    assert isinstance(back["net"], Net) and back["n"] == 3


def test_torch_tensors_come_back_on_the_cpu(area_url):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    manifest = results.send({"model": model, "t": torch.arange(4.0), "state": model.state_dict(), "plain": [1.5]})
    fmts = {k: v["format"] for k, v in manifest["values"].items()}
    assert fmts == {"model": "torch", "t": "torch", "state": "torch", "plain": "pickle"}  # plain data needs no torch
    back = results.load(as_api(area_url))
    assert torch.equal(back["t"], torch.arange(4.0)) and back["t"].device.type == "cpu"
    assert torch.equal(back["model"].weight, model.weight) and back["plain"] == [1.5]


def test_cuda_tensors_are_read_onto_the_cpu():
    """A job on a GPU saves CUDA tensors; the reader maps them to the CPU, where a plain torch.load
    would fail without CUDA. Simulated: the saved storages are tagged "cuda:0" as a GPU job's are."""
    torch = pytest.importorskip("torch")
    import io

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA (a plain torch.load would work there)")
    registry = torch.serialization._package_registry
    before = list(registry)
    torch.serialization.register_package(0, lambda obj: "cuda:0", lambda storage, location: None)
    try:
        buf = io.BytesIO()
        torch.save({"w": torch.ones(2)}, buf)
    finally:
        registry[:] = before
    buf.seek(0)
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(io.BytesIO(buf.getvalue()), weights_only=False)  # what a reader without map_location gets
    loaded = jobarea.read_value(buf, "torch")
    assert loaded["w"].device.type == "cpu" and torch.equal(loaded["w"], torch.ones(2))


# -- checkpoints --------------------------------------------------------------------------------------
def test_checkpoints_keep_the_last_n_and_load_the_latest(area_url):
    for step in range(6):
        url = runtime.save_checkpoint({"step": step, "w": [step] * 3}, step, keep=3)
    assert url == f"{area_url}/checkpoints/step-000000000005.pkl"
    assert [c.step for c in runtime.checkpoints()] == [3, 4, 5]
    ckpt = runtime.load_checkpoint()
    assert (ckpt.step, ckpt.state) == (5, {"step": 5, "w": [5, 5, 5]})
    assert runtime.load_checkpoint(step=4).state["step"] == 4
    assert runtime.load_checkpoint(step=1) is None
    runtime.save_checkpoint(b"raw bytes", 7, keep=None)
    assert runtime.load_checkpoint().state == b"raw bytes" and len(runtime.checkpoints()) == 4
    assert jobarea.latest_checkpoint(area_url).step == 7  # what the engine sees


def test_a_save_under_way_is_never_seen_and_a_failed_one_leaves_the_last(area_url):
    runtime.save_checkpoint({"ok": 1}, 1)
    area = jobarea.Area(area_url)
    # a save in progress: temporary names never count as checkpoints
    area.write_bytes("checkpoints/.step-000000000002.abc.tmp", b"half")
    with pytest.raises(TypeError):
        runtime.save_checkpoint({"lock": threading.Lock()}, 2)
    assert [c.step for c in runtime.checkpoints()] == [1]
    assert runtime.load_checkpoint().state == {"ok": 1}


def test_save_checkpoint_validates_and_only_rank_0_saves(area_url, monkeypatch):
    with pytest.raises(TypeError, match="step must be a whole number, not float"):
        runtime.save_checkpoint({}, 1.5)
    with pytest.raises(ValueError, match="step must be >= 0"):
        runtime.save_checkpoint({}, -1)
    with pytest.raises(ValueError, match="keep must be"):
        runtime.save_checkpoint({}, 1, keep=-2)
    monkeypatch.setenv("RANK", "1")
    assert runtime.save_checkpoint({"x": 1}, 3) is None
    assert runtime.checkpoints() == []


def test_resume_loads_the_offered_checkpoint_and_says_so(area_url, monkeypatch, capsys):
    assert runtime.resume() is None  # a fresh start
    for step in (10, 20):
        runtime.save_checkpoint({"at": step}, step)
    offered = jobarea.latest_checkpoint(area_url)
    monkeypatch.setenv("TRAINHUB_RESUME_URL", offered.url)
    monkeypatch.setenv("TRAINHUB_RESUME_STEP", str(offered.step))
    monkeypatch.setattr(runtime, "_resumed_said", False)
    ckpt = runtime.resume()
    assert (ckpt.step, ckpt.state) == (20, {"at": 20})
    assert "trainhub: resumed from step 20 (step-000000000020.pkl)" in capsys.readouterr().err


def test_torch_checkpoint_restores_model_optimizer_scheduler_and_rng(area_url):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        sched.step()
    runtime.save_checkpoint(runtime.torch_state(model, opt, sched, epoch=2), 2)
    expected_next = torch.randn(3)  # what the generator gives right after the save
    fresh = torch.nn.Linear(4, 2)
    fopt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    fsched = torch.optim.lr_scheduler.StepLR(fopt, step_size=1, gamma=0.5)
    torch.manual_seed(123)
    ckpt = runtime.load_checkpoint()
    assert ckpt.url.endswith(".pt")
    extra = runtime.restore_torch(ckpt.state, fresh, fopt, fsched)
    assert extra == {"epoch": 2}
    assert torch.equal(fresh.weight, model.weight) and fsched.get_last_lr() == sched.get_last_lr()
    assert fopt.state_dict()["state"][0]["momentum_buffer"].equal(opt.state_dict()["state"][0]["momentum_buffer"])
    assert torch.equal(torch.randn(3), expected_next)  # the generator continues where it was saved


def test_outside_a_job_checkpoints_and_results_stay_local(monkeypatch):
    for var in ("TRAINHUB_JOB_ID", "TRAINHUB_JOB_URL", "RANK", "TRAINHUB_RESUME_URL"):
        monkeypatch.delenv(var, raising=False)
    url = runtime.save_checkpoint({"n": 1}, 0)
    assert os.path.exists(url) and "trainhub-checkpoints-" in url
    assert runtime.load_checkpoint().state == {"n": 1} and runtime.resume() is None
    assert results.send({"v": 2})["values"] == {} and results.sent_outside_a_job() == {"v": 2}
