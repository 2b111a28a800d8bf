"""trainhub.capture.build_function_script (what ``@trainhub.remote`` sends): the generated script is run
for real as a job would run it (``python script.py`` with the job's storage area in the environment) and
its value read back with trainhub.results."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import warnings

import pytest

import trainhub
from trainhub import results
from trainhub.capture import CaptureError, build_function_script

FACTOR = 7
LAYERS = [3, 4]


class Base:
    def scale(self, x):
        return x * FACTOR


class Model(Base):  # needs Base defined first in the job
    def __init__(self, width):
        self.width = width


@functools.lru_cache(maxsize=None)
def cached_square(x):
    return x * x


@trainhub.remote(gpus=0)
def remote_helper(x):
    return x + 1


def train(n, *, extra=0):
    m = Model(n)
    return {"scaled": m.scale(n) + extra, "layers": json.dumps(LAYERS), "sq": cached_square(n),
            "helped": remote_helper(n)}  # a remote function called inside the job runs there as a plain function


def run_job(script: str, tmp_path):
    """Run the script as a job's worker (rank 0), in a folder where this test module cannot be imported,
    and return the values it sent back."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "script.py").write_text(script)
    env = dict(os.environ, TRAINHUB_JOB_ID="j-000001", TRAINHUB_JOB_URL=str(tmp_path / "area"), TRAINHUB_JOB_ATTEMPT="1",
               TRAINHUB_STORAGE_OPTIONS="{}", RANK="0")
    r = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    return r, (results.load({"id": "j-000001", "outputs_url": str(tmp_path / "area"), "attempt": 1})
               if r.returncode == 0 else None)


def test_a_function_of_the_programs_own_files_is_carried_as_source(tmp_path):
    script = build_function_script(train, (5,), {"extra": 1})
    assert set(script.carried_code) == {"Base", "Model", "cached_square", "remote_helper", "train"}
    assert script.carried_values == {"FACTOR": script.carried_values["FACTOR"], "LAYERS": script.carried_values["LAYERS"]}
    src = script.source
    assert src.index("class Base") < src.index("class Model(Base)")  # bases first
    assert "@functools.lru_cache(maxsize=None)" in src and "@trainhub.remote(" not in src
    assert "import json" in src and "import functools" in src
    r, values = run_job(src, tmp_path / "job")
    assert r.returncode == 0, r.stderr
    assert values == {"return": {"scaled": 36, "layers": "[3, 4]", "sq": 25, "helped": 6}}


def test_a_function_of_an_installed_package_is_imported_by_name(tmp_path):
    script = build_function_script(json.dumps, ([1, {"a": 2}],), {"sort_keys": True})
    assert script.carried_code == [] and "import_module('json').dumps" in script.source
    r, values = run_job(script.source, tmp_path / "job")
    assert r.returncode == 0, r.stderr
    assert values == {"return": '[1, {"a": 2}]'}


def test_only_rank_0_sends_the_value(tmp_path):
    script = build_function_script(cached_square, (3,))
    (tmp_path / "script.py").write_text(script.source)
    env = dict(os.environ, TRAINHUB_JOB_ID="j-000001", TRAINHUB_JOB_URL=str(tmp_path / "area"), RANK="1")
    subprocess.run([sys.executable, str(tmp_path / "script.py")], env=env, check=True, timeout=120)
    assert not (tmp_path / "area").exists()


def test_what_cannot_be_sent_is_refused_with_the_reason():
    def outer():
        y = 2

        def inner():
            return y
        return inner

    with pytest.raises(CaptureError, match="only functions defined at the top level"):
        build_function_script(outer())
    with pytest.raises(CaptureError, match="only functions defined at the top level"):
        build_function_script(lambda: 1)
    with pytest.raises(CaptureError, match="only functions defined at the top level"):
        build_function_script(Base.scale)
    with pytest.raises(CaptureError, match="needs a plain function, not builtin_function_or_method"):
        build_function_script(len)
    with pytest.raises(CaptureError, match=r"the arguments of cached_square\(\) cannot be pickled \(TypeError"):
        build_function_script(cached_square, (threading.Lock(),))
    with pytest.raises(CaptureError, match=r"arguments of cached_square\(\) are .* pickled, over the 1.0 KB limit"):
        build_function_script(cached_square, (b"x" * 5000,), max_value_bytes=1000)


LOCK = threading.Lock()


def uses_a_lock():
    with LOCK:
        return undefined_name  # noqa: F821


def test_remote_refuses_values_it_cannot_send_and_warns_of_undefined_names():
    with pytest.raises(CaptureError) as e:
        trainhub.remote(uses_a_lock).job_spec()
    assert "uses_a_lock() uses values that cannot be sent with the job, so nothing was submitted" in str(e.value)
    assert "  - LOCK: cannot be pickled (TypeError" in str(e.value)
    with pytest.warns(UserWarning, match=r"uses_a_lock\(\) uses names that are not defined \(undefined_name\)"):
        trainhub.remote(uses_a_lock_free).job_spec()
    fn = trainhub.remote(train, gpus=1, workers=2, time_limit="1h", env={"A": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing undefined: no warning
        spec = fn.job_spec(3)
    assert {k: spec[k] for k in ("name", "gpus", "workers", "time_limit", "env")} == {
        "name": "remote-train", "gpus": 1, "workers": 2, "time_limit": "1h", "env": {"A": "1"}}
    assert fn.options(gpus=2, name="other").job_spec(3)["gpus"] == 2


def uses_a_lock_free():
    return undefined_name  # noqa: F821


uses_a_lock_free.__name__ = uses_a_lock_free.__qualname__ = "uses_a_lock"  # the name the warning shows


def test_remote_options_are_checked():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['gpu'\]"):
        trainhub.remote(gpu=1)(train)
    with pytest.raises(TypeError, match="decorates a function"):
        trainhub.remote(3)
    assert trainhub.remote(cached_square).local(3) == 9  # the plain function, here
