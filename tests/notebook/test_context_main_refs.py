"""Values that pickle by reference to the notebook (``__main__``) need their source carried."""

import sys

from trainhub.kernels.context import build_job_script


def _notebook_function(monkeypatch):
    g = {"__name__": "__main__"}
    exec("def helper(x):\n    return x * 2\n", g)
    monkeypatch.setattr(sys.modules["__main__"], "helper", g["helper"], raising=False)
    return g["helper"]


def test_notebook_function_without_source_in_history_is_left_out(monkeypatch):
    helper = _notebook_function(monkeypatch)
    script = build_job_script("print(helper(1))", [], {"helper": helper})
    assert "helper" not in script.carried_values
    assert "whose source is not in this kernel's history" in script.left_out["helper"]


def test_notebook_function_with_source_in_history_is_carried_as_code(monkeypatch):
    helper = _notebook_function(monkeypatch)
    script = build_job_script("print(helper(1))", ["def helper(x):\n    return x * 2\n"], {"helper": helper})
    assert script.left_out == {} and script.carried_code == ["helper"]
    ns = {}
    exec(script.source.replace("print(helper(1))", "result = helper(21)"), ns)
    assert ns["result"] == 42
