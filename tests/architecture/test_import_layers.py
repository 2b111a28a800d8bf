"""The layers of docs/architecture.md hold: `lint-imports` with pyproject's [tool.importlinter] contracts.

The top-level folders install as one namespace (pyproject's package-dir: ``spawner/`` is
``trainhub.spawner``...), but grimp, which import-linter builds its graph with, reads one folder per
package: run in the checkout it would see ``trainhub/`` alone. So the contracts run on a *view* of the
tree as Python imports it: a ``trainhub/`` of real folders whose ``.py`` files are links to the
checkout's files. Every import statement counts, at module level or inside a function (a test below
plants one of each kind of breach to prove the check sees it).

Run it by hand with ``make lint-imports`` (or ``python tests/architecture/test_import_layers.py``); it prints
import-linter's report and exits non-zero when a contract is broken.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"


def package_dirs() -> dict[str, Path]:
    """Package name -> folder, as pyproject's package-dir installs them."""
    mapping = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    return {pkg: REPO / folder for pkg, folder in mapping.items()}


def build_view(dest: Path) -> Path:
    """``dest/trainhub/...``: the package tree as it imports, every module a link to its file here."""
    for pkg, folder in sorted(package_dirs().items()):
        base = dest.joinpath(*pkg.split("."))
        for src in folder.rglob("*.py"):
            rel = src.relative_to(folder)
            if "__pycache__" in rel.parts or any(part.startswith(".") for part in rel.parts):
                continue
            target = base / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(src)
    return dest


def lint_imports(view: Path) -> subprocess.CompletedProcess:
    """import-linter's own command, run in the view so `trainhub` is found there first."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as main; "
                           "sys.exit(main())", "--config", str(PYPROJECT), "--no-cache"],
                          cwd=view, env=env, capture_output=True, text=True, timeout=300)


def layer_specs() -> list[str]:
    contract = next(c for c in tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    return contract["layers"]


def layers() -> list[list[str]]:
    """The top-level modules of each layer of the "layers" contract, highest first."""
    return [[m.strip() for m in re.split(r"[:|]", layer)] for layer in layer_specs()]


def test_the_layers_hold(tmp_path):
    result = lint_imports(build_view(tmp_path))
    report = result.stdout + result.stderr
    assert result.returncode == 0 and "0 broken" in report, report


def test_function_level_imports_and_new_top_level_modules_are_caught(tmp_path):
    """The check is not blind: a kernel module importing the CLI inside a function, and a core module
    importing a service lazily, break contracts; a new top-level module in no layer fails too."""
    view = build_view(tmp_path)
    (view / "trainhub" / "kernels" / "zz_lazy_canary.py").write_text(
        "def f():\n    from trainhub.commands import jobs\n\n    return jobs\n")
    (view / "trainhub" / "zz_core_canary.py").write_text("def g():\n    import trainhub.services.jobs.app\n")
    result = lint_imports(view)
    report = result.stdout + result.stderr
    assert result.returncode != 0, report
    assert "trainhub.kernels.zz_lazy_canary -> trainhub.commands.jobs (l.2)" in report, report
    assert "The kernel side imports neither" in report.split("Broken contracts", 1)[1], report
    assert "not listed as layers" in report and "- trainhub.zz_core_canary" in report, report


def test_every_top_level_module_is_in_exactly_one_layer():
    """Listing a module twice (or a name that does not exist) would hide it; pyproject's "core" contract
    lists the same core modules as the lowest layer."""
    placed = [m for layer in layers() for m in layer]
    assert len(placed) == len(set(placed)), placed
    top = {p.stem for p in (REPO / "trainhub").iterdir() if (p.suffix == ".py" and p.stem != "__init__")
           or (p.is_dir() and (p / "__init__.py").exists())}
    top |= {pkg.split(".")[1] for pkg in package_dirs() if pkg.count(".") == 1}
    assert set(placed) == top, f"unplaced: {sorted(top - set(placed))}; absent: {sorted(set(placed) - top)}"
    contracts = {c["id"]: c for c in tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]}
    assert sorted(contracts["core"]["source_modules"]) == sorted(f"trainhub.{m}" for m in layers()[-1])


# Module names in strings (traitlets Type/Callable strings, importlib.import_module) are invisible to the
# graph: outside the composition root they may name only their own part or the core.
MODULE_STRING = re.compile(r"^trainhub\.([a-z_]+)(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def test_module_name_strings_stay_in_their_layer():
    rank = {m: i for i, layer in enumerate(layers()) for m in layer}
    independent = {i for i, spec in enumerate(layer_specs()) if "|" in spec}  # siblings that must not know each other
    composition = set(layers()[1])
    offenders = []
    for pkg, folder in package_dirs().items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            module = ".".join([*pkg.split("."), *rel.parts])
            owner = module.split(".")[1] if module.count(".") else "__init__"
            if owner in composition or owner not in rank:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    m = MODULE_STRING.match(node.value)
                    if not m or m.group(1) not in rank or m.group(1) == owner:
                        continue
                    target = m.group(1)
                    if rank[target] < rank[owner] or (rank[target] == rank[owner] and rank[owner] in independent):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not offenders, "module names of a higher layer or a sibling part:\n" + "\n".join(offenders)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="trainhub-imports-") as tmp:
        out = lint_imports(build_view(Path(tmp)))
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    sys.exit(out.returncode)
