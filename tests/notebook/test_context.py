"""Notebook context capture for %%train (trainhub.kernels.context): pure functions, no kernel."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from trainhub.kernels.context import (CellSyntaxError, build_job_script, collect_definitions, free_names,
                                      left_out_message, strip_magics)


def run_script(source: str, tmp_path) -> subprocess.CompletedProcess:
    f = tmp_path / "script.py"
    f.write_text(source)
    return subprocess.run([sys.executable, str(f)], capture_output=True, text=True, timeout=60, cwd=tmp_path)


@pytest.mark.parametrize("source, expected", [
    ("print(x)", {"x"}),
    ("x = 1\nprint(x)", set()),
    ("x = x + 1", {"x"}),
    ("x += 1", {"x"}),
    ("def f(a):\n    return a + g(b)\n", {"g", "b"}),
    ("def f():\n    return f()\n", set()),
    ("@deco(opt)\ndef f(a=DEFAULT):\n    pass\n", {"deco", "opt", "DEFAULT"}),
    ("class A(Base):\n    n = N\n    def m(self):\n        return helper()\n", {"Base", "N", "helper"}),
    ("[y * k for y in ys]", {"k", "ys"}),
    ("import numpy as np\nnp.zeros(n)", {"n"}),
    ("for i in range(3):\n    total = i\nprint(total, len(data))", {"data"}),
    ("try:\n    pass\nexcept E as e:\n    print(e)", {"E"}),
    ("lambda q: q + w", {"w"}),
])
def test_free_names(source, expected):
    assert free_names(source) == expected


def test_imports_defs_constants_are_carried_in_order(tmp_path):
    history = [
        "import os, json as j\nfrom math import sqrt\nimport collections.abc\n",
        "SCALE = 2 * 3\nNAME: str = 'x'\nLAYERS = [64, 32]\n",
        "def helper(v):\n    return sqrt(v) * SCALE\n",
        "unused = open('/nonexistent')\n",  # not needed, not carried, never run
    ]
    script = build_job_script("print(helper(16), j.dumps(LAYERS), NAME)", history, {})
    assert script.carried_code == ["LAYERS", "NAME", "SCALE", "helper", "j", "sqrt"]
    assert "import os" not in script.source and "unused" not in script.source
    assert not script.left_out and not script.undefined
    r = run_script(script.source, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == '24.0 [64, 32] x\n'


def test_last_definition_wins():
    history = ["def f():\n    return 1\n", "def f():\n    return 2\n", "g = 1", "def g():\n    return 3\n",
               "def h():\n    return 4\n", "h = make_h()\n"]
    defs = collect_definitions(history)
    assert "return 2" in defs["f"].source
    assert defs["g"].kind == "def" and defs["h"] is None  # rebound by code we don't carry
    script = build_job_script("print(f(), g(), h)", history, {"h": 42})
    assert script.source.count("def f") == 1 and "return 2" in script.source
    assert script.carried_values == {"h": pytest.approx(script.carried_values["h"])}
    assert "h = make_h" not in script.source


def test_magics_are_skipped():
    history = [
        "%%time\ndef timed():\n    pass\n",  # a cell magic: its body is not (necessarily) Python
        "%matplotlib inline\nimport json\n!pip list\nfiles = !ls\ndef kept():\n    return json\n",
        "%%train --wait\ndef in_job():\n    pass\n",
    ]
    defs = collect_definitions(history)
    assert set(defs) == {"json", "kept", "files"} and defs["files"] is None
    assert "get_ipython" in strip_magics("  %time x = 1")


def test_with_ipython_transform(shell):
    history = ["%matplotlib inline\nimport json\nx = %env HOME\ndef kept():\n    return json\n"]
    defs = collect_definitions(history, shell.transform_cell)
    assert set(defs) == {"json", "kept", "x"} and defs["x"] is None


def test_small_values_are_pickled_big_and_unpicklable_refused(tmp_path):
    ns = {"config": {"lr": 0.1, "layers": [3, 4]}, "big": b"x" * 2_000_000, "lock": threading.Lock()}
    script = build_job_script("print(config['lr'], len(big), lock)", [], ns, max_value_bytes=1_000_000)
    assert list(script.carried_values) == ["config"]
    assert set(script.left_out) == {"big", "lock"}
    assert "2.0 MB pickled, over the 1.0 MB limit" in script.left_out["big"]
    assert "cannot be pickled" in script.left_out["lock"] and "lock" in script.left_out["lock"]
    msg = left_out_message(script, 1_000_000)
    assert "  - big: " in msg and "  - lock: " in msg and "TRAINHUB_STORAGE_URL" in msg
    assert "TrainMagics.max_value_bytes" in msg and "not submitted" in msg
    assert "np.save" in msg and "pandas" not in msg  # its example uses what every platform has (numpy, fsspec)

    ok = build_job_script("print(config['lr'] * 10, config['layers'])", [], ns)
    r = run_script(ok.source, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "1.0 [3, 4]\n"


def test_value_of_a_notebook_class_carries_the_class(tmp_path):
    history = ["class Point:\n    def __init__(self, x):\n        self.x = x\n"]
    ns = {}
    exec(history[0], ns)
    ns["Point"].__module__ = "__main__"  # as in a kernel
    import __main__

    __main__.Point = ns["Point"]  # pickle looks classes up in __main__
    try:
        ns["p"] = ns["Point"](7)
        script = build_job_script("print(p.x)", history, ns)
    finally:
        del __main__.Point
    assert script.carried_code == ["Point"] and list(script.carried_values) == ["p"]
    assert script.source.index("class Point") < script.source.index("pickle.loads")
    r = run_script(script.source, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "7\n"


def test_modules_and_undefined_names():
    import json

    script = build_job_script("print(js.dumps(1), trainhub.params(), typo)", [], {"js": json})
    assert "import json as js" in script.source and "import trainhub" in script.source
    assert script.undefined == ["typo"]


@pytest.mark.parametrize("cell, lineno, words", [
    ("x = 1\nprint(x\n", 3, ["never closed"]),  # body line 2 = cell line 3 (after %%train)
    ("x = 1\n  y = 2\n", 3, ["indent"]),
    ("ok = 1\n!nvidia-smi\n", 3, ["magics and shell escapes", "subprocess"]),
])
def test_syntax_errors_have_the_cell_line(cell, lineno, words):
    with pytest.raises(CellSyntaxError) as e:
        build_job_script(cell, [], {}, line_offset=1)
    assert e.value.lineno == lineno
    assert all(w in e.value.msg for w in words), e.value.msg
