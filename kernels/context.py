"""Notebook context for ``%%train``: turn a cell into a self-contained job script.

A ``%%train`` cell usually calls helpers defined in earlier cells. :func:`build_job_script`
collects, from the cells this kernel already ran, the imports, function and class definitions
and simple constant assignments (``LR = 0.1``) the cell needs (the last definition of each name
wins; statements that are magics or shell escapes are ignored, ``%%`` cells skipped whole), then
embeds the values of other names the cell uses, pickled, when they are small. Values that are
too big or cannot be pickled are listed in :attr:`JobScript.left_out` with the reason; the magic
refuses to submit and tells the user how to pass data instead.

Pure functions over strings and a namespace dict: no IPython needed here.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import pickle
import re
import symtable
import types
from dataclasses import dataclass, field

from trainhub.fmt import fmt_size

DEFAULT_MAX_VALUE_BYTES = 1_000_000

# names an IPython namespace holds that are never user data
IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "display", "open"})
BUILTIN_NAMES = frozenset(dir(builtins)) | {"__name__", "__file__", "__builtins__", "__doc__"}


class CellSyntaxError(ValueError):
    """The cell is not valid Python; ``lineno`` is 1-based within the given source."""

    def __init__(self, message: str, lineno: int | None, line: str = "", offset: int | None = None):
        super().__init__(message)
        self.msg = message
        self.lineno = lineno
        self.line = line
        self.offset = offset


@dataclass
class Definition:
    name: str
    source: str  # the statement's source text (one alias for imports)
    order: tuple  # (cell index, statement index): where it was last run
    kind: str  # "import", "def", "class", "const"


@dataclass
class JobScript:
    source: str  # the whole script submitted as the job's `script`
    carried_code: list[str] = field(default_factory=list)  # names carried as code
    carried_values: dict[str, int] = field(default_factory=dict)  # name -> pickled size in bytes
    left_out: dict[str, str] = field(default_factory=dict)  # name -> why it was not carried
    undefined: list[str] = field(default_factory=list)  # used by the cell, not known to the kernel


# -- parsing helpers ----------------------------------------------------------------------------
def parse_cell(source: str, line_offset: int = 0) -> ast.Module:
    """Parse ``source``; raise :class:`CellSyntaxError` with a line number (+ ``line_offset``)."""
    try:
        return ast.parse(source)
    except SyntaxError as e:
        lineno = e.lineno
        line = (e.text or "").rstrip("\n")
        if lineno is not None and 1 <= lineno <= len(source.splitlines()):
            line = source.splitlines()[lineno - 1]
        msg = e.msg
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")) or ("= !" in line) or ("= %" in line):
            msg = ("IPython magics and shell escapes (%magic, !cmd) do not run in a job: "
                   "use subprocess.run([...]) or os.system(...) instead")
        raise CellSyntaxError(msg, None if lineno is None else lineno + line_offset, line, e.offset) from None


def _is_ipython_call(node: ast.AST) -> bool:
    """True for statements IPython generated from magics: get_ipython().run_line_magic(...) etc."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id == "get_ipython":
            return True
    return False


def _segment(src: str, stmt) -> str:
    """A top-level statement's source, decorators included."""
    start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
    return "\n".join(src.splitlines()[start - 1:stmt.end_lineno])


_MAGIC_LINE = re.compile(r"^(\s*)(\w+\s*=\s*)?[!%]")


def strip_magics(raw: str) -> str:
    """Without IPython at hand: turn magic and shell-escape lines into get_ipython() calls (skipped)."""
    return "\n".join(m.group(1) + (m.group(2) or "") + "get_ipython()" if (m := _MAGIC_LINE.match(line)) else line
                     for line in raw.splitlines())


def _transform(raw: str, transform=None) -> str | None:
    """Raw cell -> Python source, or None for cells to skip (cell magics, unparsable)."""
    if raw.lstrip().startswith("%%"):
        return None
    try:
        return (transform or strip_magics)(raw)
    except Exception:
        return None


_LITERAL_NODES = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.BinOp, ast.UnaryOp,
                  ast.operator, ast.unaryop, ast.Load, ast.expr_context)


def _is_constant_expr(node: ast.AST) -> bool:
    """Literals and arithmetic on literals: 0.1, "x", [64, 32], {"a": 1}, 32 * 4, 2 ** -3."""
    return all(isinstance(n, _LITERAL_NODES) for n in ast.walk(node))


def _import_aliases(stmt) -> list[tuple[str, str]]:
    out = []
    for alias in stmt.names:
        if alias.name == "*":
            continue
        if isinstance(stmt, ast.Import):
            bound = alias.asname or alias.name.split(".")[0]
            src = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
        else:
            bound = alias.asname or alias.name
            src = (f"from {'.' * stmt.level}{stmt.module or ''} import {alias.name}"
                   + (f" as {alias.asname}" if alias.asname else ""))
        out.append((bound, src))
    return out


def _stored_names(stmt) -> set[str]:
    """Top-level names a statement binds (assignments, for targets, with-as, walrus, defs, imports)."""
    names = set()
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {b for b, _ in _import_aliases(stmt)}
    for n in ast.walk(stmt):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) and n is not stmt:
            # don't descend: nested scopes bind their own names (walk still visits them; filter below)
            pass
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {b for b, _ in _import_aliases(n)}
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
    return names


def collect_definitions(cells: list[str], transform=None) -> dict[str, Definition | None]:
    """From cells in run order, the last top-level binding of each name: a :class:`Definition`
    when it can be carried as code, None when it cannot (``x = load()``: its value may be carried)."""
    defs: dict[str, Definition | None] = {}
    for ci, raw in enumerate(cells):
        if not raw or not raw.strip():
            continue
        src = _transform(raw, transform)
        if src is None:
            continue
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue  # it failed in the kernel too: nothing it defined exists
        for si, stmt in enumerate(tree.body):
            order = (ci, si)
            if _is_ipython_call(stmt):  # a line magic or shell escape: never carried
                for name in _stored_names(stmt):
                    defs[name] = None  # files = !ls: its value may be carried
                continue
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                    continue
                for bound, isrc in _import_aliases(stmt):
                    defs[bound] = Definition(bound, isrc, order, "import")
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kind = "class" if isinstance(stmt, ast.ClassDef) else "def"
                defs[stmt.name] = Definition(stmt.name, _segment(src, stmt), order, kind)
            elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                  and _is_constant_expr(stmt.value)):
                name = stmt.targets[0].id
                defs[name] = Definition(name, ast.get_source_segment(src, stmt) or ast.unparse(stmt), order, "const")
            elif (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None
                  and _is_constant_expr(stmt.value)):
                name = stmt.target.id
                defs[name] = Definition(name, f"{name} = {ast.unparse(stmt.value)}", order, "const")
            elif isinstance(stmt, ast.Delete):
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        defs.pop(t.id, None)
            else:
                for name in _stored_names(stmt):
                    defs[name] = None  # rebound by code we don't carry: use its value instead
    return defs


# -- free names ---------------------------------------------------------------------------------
class _ModuleLevel(ast.NodeVisitor):
    """Names a module's top-level code reads before binding them, in execution order
    (function and lambda bodies are left to symtable)."""

    def __init__(self):
        self.bound: set[str] = set()
        self.free: set[str] = set()

    def _load(self, name):
        if name not in self.bound:
            self.free.add(name)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self._load(node.id)
        else:
            self.bound.add(node.id)

    def visit_Assign(self, node):
        self.visit(node.value)
        for t in node.targets:
            self.visit(t)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            self._load(node.target.id)
        self.visit(node.value)
        self.visit(node.target)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for s in node.body + node.orelse:
            self.visit(s)

    visit_AsyncFor = visit_For

    def visit_Import(self, node):
        self.bound |= {b for b, _ in _import_aliases(node)}

    visit_ImportFrom = visit_Import

    def _def(self, node):
        for d in node.decorator_list:
            self.visit(d)
        args = node.args
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(d)
        self.bound.add(node.name)

    visit_FunctionDef = visit_AsyncFunctionDef = _def

    def visit_ClassDef(self, node):
        for d in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(d)
        self.bound.add(node.name)  # the body's names are read by symtable (class scope)

    def visit_Lambda(self, node):
        for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(d)

    def _comp(self, node):
        self.visit(node.generators[0].iter)  # the rest runs in the comprehension's scope

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comp

    def visit_ExceptHandler(self, node):
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bound.add(node.name)
        for s in node.body:
            self.visit(s)

    def visit_Global(self, node):
        pass


def _nested_globals(table: symtable.SymbolTable) -> set[str]:
    out = set()
    for child in table.get_children():
        for sym in child.get_symbols():
            if sym.is_global() and (sym.is_referenced() or sym.is_assigned()):
                out.add(sym.get_name())
        out |= _nested_globals(child)
    return out


def free_names(source: str | ast.Module) -> set[str]:
    """Global names ``source`` reads without binding them first (builtins excluded)."""
    tree = source if isinstance(source, ast.Module) else ast.parse(source)
    text = source if isinstance(source, str) else ast.unparse(tree)
    v = _ModuleLevel()
    for stmt in tree.body:
        v.visit(stmt)
    try:
        nested = _nested_globals(symtable.symtable(text, "<cell>", "exec"))
    except SyntaxError:
        nested = set()
    module_bound = set()
    for stmt in tree.body:
        module_bound |= _stored_names(stmt)
    return (v.free | (nested - module_bound)) - BUILTIN_NAMES


# -- values -------------------------------------------------------------------------------------
class _MainTracker(pickle.Pickler):
    """Pickler that records classes/functions from ``__main__`` (the notebook) it meets: the
    job must define them (carried code) before it can unpickle."""

    def __init__(self, file):
        super().__init__(file, protocol=4)
        self.main_names: set[str] = set()

    def reducer_override(self, obj):
        t = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
        if getattr(t, "__module__", None) == "__main__":
            self.main_names.add(getattr(t, "__qualname__", t.__name__).split(".")[0])
        return NotImplemented


def pickle_value(value) -> tuple[bytes, set[str]]:
    buf = io.BytesIO()
    p = _MainTracker(buf)
    p.dump(value)
    return buf.getvalue(), p.main_names


# -- the script ---------------------------------------------------------------------------------
def build_job_script(cell: str, history: list[str], user_ns: dict | None = None, *,
                     max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES, transform=None,
                     line_offset: int = 1) -> JobScript:
    """Make the job script for ``cell`` (the ``%%train`` body).

    ``history``: the raw sources of cells already run, oldest first; ``transform``: turns a raw cell
    into Python (IPython's ``shell.transform_cell``), so line magics become ``get_ipython()`` calls that
    are skipped. ``user_ns``: the kernel namespace, for values. ``line_offset``: added to syntax-error
    line numbers (1: the ``%%train`` line is the cell's first line).
    """
    user_ns = user_ns or {}
    tree = parse_cell(cell, line_offset)
    defs = collect_definitions(history, transform)

    needed = free_names(tree)
    carried: dict[str, Definition] = {}
    values: dict[str, object] = {}
    modules: dict[str, str] = {}
    undefined: list[str] = []
    left_out: dict[str, str] = {}
    seen: set[str] = set()
    queue = sorted(needed)
    while queue:
        name = queue.pop(0)
        if name in seen or name in BUILTIN_NAMES:
            continue
        seen.add(name)
        d = defs.get(name)
        if d is not None:
            carried[name] = d
            try:
                queue += sorted(free_names(d.source) - {name})
            except SyntaxError:
                pass
            continue
        if name in IPYTHON_NAMES or name.startswith("_"):
            continue
        if name not in user_ns:
            if name == "trainhub":
                modules[name] = "trainhub"
            else:
                undefined.append(name)
            continue
        value = user_ns[name]
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        try:
            data, main_names = pickle_value(value)
        except Exception as e:  # pickle raises many kinds
            left_out[name] = f"cannot be pickled ({type(e).__name__}: {str(e)[:120]})"
            continue
        if len(data) > max_value_bytes:
            left_out[name] = f"{fmt_size(len(data))} pickled, over the {fmt_size(max_value_bytes)} limit"
            continue
        missing_src = sorted(n for n in main_names if defs.get(n) is None)
        if missing_src:
            # pickled by reference to the notebook, but the job could not define it: it would fail to load
            left_out[name] = (f"needs {', '.join(missing_src)} from the notebook, whose source is not in this "
                              "kernel's history (define it in a cell, then run %%train again)")
            continue
        values[name] = (value, len(data))
        queue += sorted(main_names - seen)

    # a value whose class is defined in the notebook needs that class carried before unpickling
    return JobScript(
        source=_render(cell, carried, modules, {k: v for k, (v, _) in values.items()}),
        carried_code=sorted(carried),
        carried_values={k: n for k, (_, n) in values.items()},
        left_out=left_out,
        undefined=sorted(undefined),
    )


def _render(cell: str, carried: dict[str, Definition], modules: dict[str, str], values: dict) -> str:
    out = ["# Job script generated by trainhub's %%train from a notebook cell."]
    if modules or carried:
        out.append("\n# --- notebook context: imports, definitions and constants from earlier cells ---")
    for name, module in sorted(modules.items()):
        out.append(f"import {module}" if name == module else f"import {module} as {name}")
    seen_src = set()
    for d in sorted(carried.values(), key=lambda d: d.order):
        if d.source in seen_src:
            continue
        seen_src.add(d.source)
        out.append(d.source if d.kind in ("import", "const") else "\n" + d.source.rstrip() + "\n")
    if values:
        blob = base64.b64encode(pickle.dumps(values, protocol=4)).decode("ascii")
        lines = [blob[i:i + 100] for i in range(0, len(blob), 100)]
        out.append("\n# --- values from the notebook: " + ", ".join(sorted(values)) + " (pickled) ---")
        out.append("import base64 as _th_b64, pickle as _th_pickle\nglobals().update(_th_pickle.loads(_th_b64.b64decode(")
        out += [f'    "{ln}"' for ln in lines]
        out.append(")))\ndel _th_b64, _th_pickle")
    out.append("\n# --- the %%train cell ---")
    out.append(cell.rstrip() + "\n")
    return "\n".join(out)


def left_out_message(script: JobScript, max_value_bytes: int) -> str:
    """The message shown when values could not be carried into the job."""
    lines = ["%%train: these variables are used by the cell but cannot be sent with the job, so it was not submitted:"]
    for name, why in sorted(script.left_out.items()):
        lines.append(f"  - {name}: {why}")
    lines += [
        "Pass data through storage instead: save it from the notebook under $TRAINHUB_STORAGE_URL (your storage,",
        "visible to jobs) and read that path in the cell, e.g.",
        "    path = os.environ['TRAINHUB_STORAGE_URL'] + '/data/train.parquet'   # df.to_parquet(path) in the notebook",
        "    df = pandas.read_parquet(path)                                        # in the %%train cell",
        "or build the value inside the cell. Values up to "
        f"{fmt_size(max_value_bytes)} are sent pickled (raise it with %config TrainMagics.max_value_bytes = N);",
        "pass --ignore-missing to submit anyway (the job fails with NameError if it uses them).",
    ]
    return "\n".join(lines)
