"""The capture carries what annotations need (issue 34): pure, no kernel.

pytorch/examples' ``def prepare_dataloader(dataset: Dataset, batch_size: int)`` uses ``Dataset`` only in an
annotation; without it the job died with ``NameError: name 'Dataset' is not defined``. Annotations evaluated when
the code runs (function arguments and returns, annotated assignments, class bodies) are needed names; those Python
postpones (``from __future__ import annotations``, strings) are carried when known (dataclasses, pydantic and
``typing.get_type_hints`` read them) and never reported as missing. ``from __future__`` imports go to the top of the
script, where Python allows them.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from trainhub.capture import annotation_names, build_job_script, build_function_script, free_names


@pytest.mark.parametrize("source, free, annotations", [
    ("def f(d: Dataset) -> R: pass", {"Dataset", "R"}, {"Dataset", "R"}),
    ("async def f(*a: A, k: K = 1, **kw: KW) -> R: pass", {"A", "K", "KW", "R"}, {"A", "K", "KW", "R"}),
    ("def f(a: int, /, b: str = D) -> None: pass", {"D"}, set()),
    ("x: Foo = 1", {"Foo"}, {"Foo"}),
    ("x: Foo", {"Foo"}, {"Foo"}),
    ("class A:\n    x: Foo = 1\n    def m(self, a: Bar) -> Baz: pass", {"Foo", "Bar", "Baz"}, {"Foo", "Bar", "Baz"}),
    ("from __future__ import annotations\ndef f(d: Dataset) -> R: pass", set(), {"Dataset", "R"}),
    ("from __future__ import annotations\nclass A:\n    x: Foo\n    def m(self, a: Bar) -> Baz: pass", set(),
     {"Foo", "Bar", "Baz"}),
    ('def f(a: "List[Model]") -> "A": pass\nclass A: pass', set(), {"List", "Model"}),  # A: bound by the code itself
    ("def f(a: Literal['some words']): pass", {"Literal"}, {"Literal"}),
    ("def f(a: int) -> list[str]: pass", set(), set()),  # builtins
])
def test_free_and_annotation_names(source, free, annotations):
    assert free_names(source) == free
    assert annotation_names(source) == annotations


UPSTREAM_CELLS = [
    "import torch\nfrom torch.utils.data import Dataset, DataLoader\nimport os\n",
    "def prepare_dataloader(dataset: Dataset, batch_size: int):\n"
    "    return DataLoader(dataset, batch_size=batch_size, shuffle=False)\n",
]


def _run(source: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)


def test_an_import_used_only_in_an_annotation_is_carried_and_the_script_runs():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    ns = {"torch": torch, "Dataset": Dataset, "DataLoader": DataLoader, "os": __import__("os")}
    script = build_job_script("dl = prepare_dataloader(list(range(6)), 4)\nprint('batches', len(dl))\n",
                              UPSTREAM_CELLS, ns)
    assert "from torch.utils.data import Dataset" in script.source
    assert {"Dataset", "DataLoader", "prepare_dataloader"} <= set(script.carried_code) and not script.undefined
    out = _run(script.source)
    assert out.returncode == 0 and "batches 2" in out.stdout, out.stderr


def test_annotated_assignments_and_class_bodies_are_carried():
    cells = ["from typing import Sequence, Mapping\nfrom dataclasses import dataclass\nimport fractions\n",
             "Scale = fractions.Fraction\n",
             "@dataclass\nclass Config:\n    sizes: Sequence[int]\n    def total(self) -> Scale:\n"
             "        return Scale(sum(self.sizes))\n"]
    ns = {"Sequence": __import__("typing").Sequence, "Mapping": __import__("typing").Mapping,
          "dataclass": __import__("dataclasses").dataclass, "fractions": __import__("fractions")}
    ns["Scale"] = ns["fractions"].Fraction
    cell = "weights: Mapping[str, int] = {'a': 1}\nprint(Config([1, 2]).total(), weights)\n"
    script = build_job_script(cell, cells, ns)
    assert {"Config", "Sequence", "Mapping", "Scale", "dataclass"} <= set(script.carried_code) | set(script.carried_values)
    out = _run(script.source)
    assert out.returncode == 0 and "3 {'a': 1}" in out.stdout, (out.stderr, script.source)


def test_postponed_annotations_are_carried_when_known_and_the_future_import_goes_first():
    """A cell with ``from __future__ import annotations`` whose dataclass is read with get_type_hints: its
    annotation names are carried (known) or quietly left (a forward reference); the future import, which must be
    the first statement, moves to the top of the script."""
    cells = ["from typing import Sequence\n"]
    cell = ("from __future__ import annotations\nimport dataclasses, typing\n@dataclasses.dataclass\nclass Batch:\n"
            "    items: Sequence[int]\n    nxt: Batch | None = None\n    later: NotDefinedAnywhere | None = None\n"
            "print(typing.get_type_hints(Batch, localns={'NotDefinedAnywhere': int})['items'])\n")
    script = build_job_script(cell, cells, {"Sequence": __import__("typing").Sequence})
    assert script.source.splitlines()[1] == "from __future__ import annotations"
    assert "Sequence" in script.carried_code and script.undefined == []
    out = _run(script.source)
    assert out.returncode == 0 and "typing.Sequence[int]" in out.stdout, (out.stderr, script.source)


def test_a_future_import_of_an_earlier_cell_applies_to_the_job_as_in_the_kernel():
    cells = ["from __future__ import annotations\n", "def f(x: OnlyATypeCheckerKnowsMe) -> int:\n    return 1\n"]
    script = build_job_script("print(f(0))\n", cells, {})
    assert script.source.splitlines()[1] == "from __future__ import annotations"
    assert script.undefined == []  # postponed: not evaluated, so not missing
    out = _run(script.source)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr


def test_with_a_working_directory_its_modules_come_first_on_sys_path(tmp_path):
    (tmp_path / "helpers.py").write_text("VALUE = 41\n")
    script = build_job_script("from helpers import VALUE\nimport sys, os\nprint(VALUE + 1, sys.path[0] == os.getcwd())\n",
                              ["from __future__ import annotations\n"], {}, workdir=True)
    lines = script.source.splitlines()
    assert lines[1] == "from __future__ import annotations" and "sys.path.insert(0" in script.source
    (tmp_path / "elsewhere").mkdir()
    path = tmp_path / "elsewhere" / "script.py"  # a job's script lives apart from its working directory
    path.write_text(script.source)
    out = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "42 True", out.stderr


def test_a_remote_function_of_a_postponed_module_keeps_its_annotations_postponed(tmp_path):
    mod = types.ModuleType("postponed_mod")
    mod.__file__ = str(tmp_path / "postponed_mod.py")
    src = ("from __future__ import annotations\nimport typing\nif typing.TYPE_CHECKING:\n    from nowhere import Thing\n"
           "def fn(x: Thing) -> Thing:\n    return x * 2\n")
    (tmp_path / "postponed_mod.py").write_text(src)
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    sys.modules["postponed_mod"] = mod
    try:
        script = build_function_script(mod.fn, (21,))
    finally:
        del sys.modules["postponed_mod"]
    assert script.source.splitlines()[1] == "from __future__ import annotations"
    compile(script.source, "script.py", "exec")  # the future import is where Python accepts it
