"""Context capture: turn notebook code or a Python function into a self-contained job script.

The one place where trainhub decides what a job needs from the code that submitted it, used by
``%%train`` (:func:`build_job_script`, kernel side) and by ``@trainhub.remote``
(:func:`build_function_script`, any Python program).

A ``%%train`` cell usually calls helpers defined in earlier cells. :func:`build_job_script`
collects, from the cells this kernel already ran, the imports, function and class definitions
and simple constant assignments (``LR = 0.1``) the cell needs, annotations included (the last definition of
each name wins; statements that are magics or shell escapes are ignored, ``%%`` cells skipped whole), then
embeds the values of other names the cell uses, pickled, when they are small. Values that are
too big or cannot be pickled are listed in :attr:`JobScript.left_out` with the reason; the magic
refuses to submit and tells the user how to pass data instead.

:func:`build_function_script` does the same for one function: its source (and the sources of
the functions and classes of its module it uses), the modules it uses, other globals pickled,
then the call with pickled arguments. Both resolve names with :func:`resolve_context` and write
the script with :func:`render_script`; both can end the script by sending values back
(``returns``: see :mod:`trainhub.results`).

Pure functions over strings, functions and namespace dicts: no IPython needed here.
"""

from __future__ import annotations

import __future__
import ast
import base64
import builtins
import inspect
import io
import os
import pickle
import re
import symtable
import sys
import textwrap
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
    (function and lambda bodies are left to symtable). Annotations evaluated at definition time count
    (a top-level function's arguments and return, a top-level annotated assignment) unless
    ``postponed`` (``from __future__ import annotations``)."""

    def __init__(self, postponed: bool = False):
        self.bound: set[str] = set()
        self.free: set[str] = set()
        self.postponed = postponed

    def _annotation(self, node):
        if node is not None and not self.postponed:
            self.visit(node)

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
        self._annotation(node.annotation)
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
        for a in _arguments(args):
            self._annotation(a.annotation)
        self._annotation(node.returns)
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


def _arguments(args: ast.arguments) -> list[ast.arg]:
    return [*args.posonlyargs, *args.args, *([args.vararg] if args.vararg else []), *args.kwonlyargs,
            *([args.kwarg] if args.kwarg else [])]


def future_features(source: str | ast.Module) -> list[str]:
    """The ``from __future__ import ...`` features of ``source``'s top level, in order."""
    tree = source if isinstance(source, ast.Module) else ast.parse(source)
    out: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            out += [a.name for a in stmt.names if a.name not in out]
    return out


def _names_in_annotation(node: ast.AST | None) -> set[str]:
    """Names an annotation reads, strings included (``"Dataset"``, ``list["Model"]``: forward references)."""
    out: set[str] = set()
    if node is None:
        return out
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.strip():
            try:
                out |= _names_in_annotation(ast.parse(n.value.strip(), mode="eval"))
            except SyntaxError:
                pass  # Literal["some text"]
    return out


def annotation_names(source: str | ast.Module) -> set[str]:
    """Every name the annotations of ``source`` read (arguments, returns, annotated assignments; in classes and
    functions too; strings parsed as forward references): what ``typing.get_type_hints``, dataclasses or pydantic
    need, even where Python itself does not evaluate them (``from __future__ import annotations``). Builtins and
    names ``source`` binds at its top level are left out."""
    tree = source if isinstance(source, ast.Module) else ast.parse(source)
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in _arguments(n.args):
                out |= _names_in_annotation(a.annotation)
            out |= _names_in_annotation(n.returns)
        elif isinstance(n, ast.AnnAssign):
            out |= _names_in_annotation(n.annotation)
    bound: set[str] = set()
    for stmt in tree.body:
        bound |= _stored_names(stmt)
    return out - bound - BUILTIN_NAMES


def free_names(source: str | ast.Module, postponed: bool = False) -> set[str]:
    """Global names ``source`` reads without binding them first (builtins excluded), annotations evaluated at
    definition time included (see :func:`annotation_names` for all of them); ``postponed``: annotations are not
    evaluated, as under ``from __future__ import annotations`` (which ``source`` may also say itself)."""
    tree = source if isinstance(source, ast.Module) else ast.parse(source)
    text = source if isinstance(source, str) else ast.unparse(tree)
    v = _ModuleLevel(postponed=postponed or "annotations" in future_features(tree))
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



# -- resolving names --------------------------------------------------------------------------------
@dataclass
class Resolved:
    """What :func:`resolve_context` found for the names some code reads."""

    carried: dict[str, Definition] = field(default_factory=dict)  # name -> source carried as code
    modules: dict[str, str] = field(default_factory=dict)  # bound name -> module name
    values: dict[str, tuple[object, int]] = field(default_factory=dict)  # name -> (value, pickled size)
    late: set[str] = field(default_factory=set)  # values pickled by reference to carried code: loaded after it
    left_out: dict[str, str] = field(default_factory=dict)  # name -> why it cannot be carried
    undefined: list[str] = field(default_factory=list)  # read, but bound nowhere


def resolve_context(needed, definition_of, namespace, *, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
                    optional=(), postponed: bool = False) -> Resolved:
    """Decide, for each name in ``needed`` and everything the carried code needs in turn, how the job gets it.

    ``definition_of(name)``: a :class:`Definition` when the name can be carried as source (an import,
    a function or class, a constant), else None. ``namespace``: the live values. A module becomes an
    import, any other value is pickled (at most ``max_value_bytes``); a value pickled by reference to
    ``__main__`` needs that class or function carried as source too. Names starting with ``_`` and
    IPython's own names are never carried.

    ``optional``: names carried the same way when they can be, but never reported as undefined (the names of
    annotations Python does not evaluate: see :func:`annotation_names`); carried code adds its own. ``postponed``:
    the script imports ``annotations`` from ``__future__``, so carried code does not evaluate its annotations.
    """
    out = Resolved()
    seen: set[str] = set()
    queue = [(n, False) for n in sorted(needed)] + [(n, True) for n in sorted(set(optional) - set(needed))]
    while queue:
        name, soft = queue.pop(0)
        if name in seen or name in BUILTIN_NAMES:
            continue
        d = definition_of(name)
        if soft and d is None and name not in namespace:
            continue  # a forward reference, or a name only a type checker knows: looked up again if needed
        seen.add(name)
        if d is not None:
            out.carried[name] = d
            try:
                queue += [(n, False) for n in sorted(free_names(d.source, postponed) - {name})]
                queue += [(n, True) for n in sorted(annotation_names(d.source) - {name})]
            except SyntaxError:
                pass
            continue
        if name in IPYTHON_NAMES or name.startswith("_"):
            continue
        if name not in namespace:
            if name == "trainhub":
                out.modules[name] = "trainhub"
            else:
                out.undefined.append(name)
            continue
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            out.modules[name] = value.__name__
            continue
        try:
            data, main_names = pickle_value(value)
        except Exception as e:  # pickle raises many kinds
            if not soft:
                out.left_out[name] = f"cannot be pickled ({type(e).__name__}: {str(e)[:120]})"
            continue
        if len(data) > max_value_bytes:
            if not soft:
                out.left_out[name] = f"{fmt_size(len(data))} pickled, over the {fmt_size(max_value_bytes)} limit"
            continue
        missing_src = sorted(n for n in main_names if definition_of(n) is None)
        if missing_src and soft:
            continue
        if missing_src:
            # pickled by reference to the notebook, but the job could not define it: it would fail to load
            out.left_out[name] = (f"needs {', '.join(missing_src)} from the notebook, whose source is not in this "
                                  "kernel's history (define it in a cell, then run %%train again)")
            continue
        out.values[name] = (value, len(data))
        if main_names:
            out.late.add(name)
        queue += [(n, False) for n in sorted(main_names - seen)]
    out.undefined.sort()
    return out


# -- the script ---------------------------------------------------------------------------------
def history_futures(cells: list[str], transform=None) -> list[str]:
    """The ``from __future__`` features earlier cells turned on: IPython compiles every later cell with them."""
    out: list[str] = []
    for raw in cells:
        src = _transform(raw, transform) if raw and raw.strip() else None
        if src is None or "__future__" not in src:
            continue
        try:
            out += [f for f in future_features(src) if f not in out]
        except SyntaxError:
            continue
    return out


def build_job_script(cell: str, history: list[str], user_ns: dict | None = None, *,
                     max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES, transform=None,
                     line_offset: int = 1, returns: list[str] | None = None, workdir: bool = False) -> JobScript:
    """Make the job script for ``cell`` (the ``%%train`` body).

    ``history``: the raw sources of cells already run, oldest first; ``transform``: turns a raw cell
    into Python (IPython's ``shell.transform_cell``), so line magics become ``get_ipython()`` calls that
    are skipped. ``user_ns``: the kernel namespace, for values. ``line_offset``: added to syntax-error
    line numbers (1: the ``%%train`` line is the cell's first line). ``returns``: names whose values
    rank 0 sends back when the cell has finished (``--return``); see :func:`check_returns`. ``workdir``:
    the job runs in a copy of the notebook's folder (trainhub.workdir): its modules are imported from
    there first, as in the notebook (``sys.path[0]`` is the working directory).
    """
    user_ns = user_ns or {}
    tree = parse_cell(cell, line_offset)
    defs = collect_definitions(history, transform)
    future = history_futures(history, transform)
    future += [f for f in future_features(tree) if f not in future]
    if "annotations" in future and "annotations" not in future_features(tree):
        # the kernel compiles the cell with the annotations of an earlier cell's import postponed: so does the job
        tree = parse_cell("from __future__ import annotations\n" + cell, line_offset - 1)
    r = resolve_context(free_names(tree), defs.get, user_ns, max_value_bytes=max_value_bytes,
                        optional=annotation_names(tree), postponed="annotations" in future)
    return JobScript(
        source=render_script(cell, r, header="generated by trainhub's %%train from a notebook cell",
                             body_title="the %%train cell", returns=returns, future=future, path0_cwd=workdir),
        carried_code=sorted(r.carried),
        carried_values={k: n for k, (_, n) in r.values.items()},
        left_out=r.left_out,
        undefined=r.undefined,
    )


def check_returns(cell: str, returns: list[str], script: JobScript) -> list[str]:
    """The names of ``returns`` the job could never have when the cell ends: neither bound by the cell
    nor carried with it (a typo, or a value left out). Identifiers are checked by the caller."""
    bound: set[str] = set()
    for stmt in ast.parse(cell).body:
        bound |= _stored_names(stmt)
    known = bound | set(script.carried_code) | set(script.carried_values)
    return [n for n in returns if n not in known and n not in _modules_in(script.source)]


def _modules_in(source: str) -> set[str]:
    names: set[str] = set()
    for stmt in ast.parse(source).body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names |= {b for b, _ in _import_aliases(stmt)}
    return names


PATH0_CWD = ("import os as _th_os, sys as _th_sys\n"
             "_th_sys.path.insert(0, _th_os.getcwd())  # the working directory first, as in the notebook\n"
             "del _th_os, _th_sys")


def _without_futures(body: str) -> str:
    """``body`` with its top-level ``from __future__`` imports turned into comments (the script starts with them)."""
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return body
    lines = body.splitlines()
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            for i in range(stmt.lineno - 1, stmt.end_lineno):
                lines[i] = "# " + lines[i] + ("  (moved to the top of the script)" if i == stmt.lineno - 1 else "")
    return "\n".join(lines) + ("\n" if body.endswith("\n") else "")


def render_script(body: str, r: Resolved, *, header: str, body_title: str, returns: list[str] | None = None,
                  order=None, origin: str = "earlier cells", future=(), path0_cwd: bool = False) -> str:
    """The job script: imports and modules, carried definitions (in ``order``, default: where they were
    last run), pickled values, then ``body``; with ``returns``, rank 0 sends those names back at the end.
    ``future``: ``__future__`` features, imported first (the body's own such imports become comments);
    ``path0_cwd``: the working directory goes first on ``sys.path`` before anything is imported."""
    carried, modules = r.carried, r.modules
    # values come before the definitions (a class body, a decorator or an annotation may read one: Scale =
    # fractions.Fraction), but those pickled by reference to carried classes or functions after them
    early = {k: v for k, (v, _) in r.values.items() if k not in r.late}
    values = {k: v for k, (v, _) in r.values.items() if k in r.late}
    out = [f"# Job script {header}."]
    if future:
        out.append(f"from __future__ import {', '.join(future)}")
        body = _without_futures(body)
    if path0_cwd:
        out.append(PATH0_CWD)
    if modules or carried:
        out.append(f"\n# --- context: imports, definitions and constants from {origin} ---")
    for name, module in sorted(modules.items()):
        out.append(f"import {module}" if name == module else f"import {module} as {name}")
    if early:
        out.append(f"\n# --- values from {origin}: " + ", ".join(sorted(early)) + " (pickled) ---")
        out.append("import base64 as _th_b64, pickle as _th_pickle")
        out.append(pickled_assignment(early))
    seen_src = set()
    for d in (order if order is not None else sorted(carried.values(), key=lambda d: d.order)):
        if d.source in seen_src:
            continue
        seen_src.add(d.source)
        out.append(d.source if d.kind in ("import", "const") else "\n" + d.source.rstrip() + "\n")
    if values:
        out.append(f"\n# --- values from {origin}: " + ", ".join(sorted(values)) + " (pickled) ---")
        out.append("import base64 as _th_b64, pickle as _th_pickle")
        out.append(pickled_assignment(values))
    out.append(f"\n# --- {body_title} ---")
    out.append(body.rstrip() + "\n")
    if returns:
        out.append("# --- sent back when the code above has finished (rank 0; see trainhub.results) ---")
        out.append(f"import trainhub.results as _th_results\n_th_results.send_names(globals(), {list(returns)!r})\n")
    return "\n".join(out)


def pickled_assignment(values: dict) -> str:
    """Python source that unpickles ``values`` (base64 in the script) into the script's globals."""
    return f"globals().update({unpickle_expression(values)})\ndel _th_b64, _th_pickle"


def unpickle_expression(value) -> str:
    """A Python expression (after ``import base64 as _th_b64, pickle as _th_pickle``, which it starts
    with on its own line) that rebuilds ``value`` from its pickle, base64 in the script."""
    blob = base64.b64encode(pickle.dumps(value, protocol=4)).decode("ascii")
    lines = [f'    "{blob[i:i + 100]}"' for i in range(0, len(blob), 100)]
    return "\n".join(["_th_pickle.loads(_th_b64.b64decode("] + lines + ["))"])


# -- a function as a job (@trainhub.remote) ------------------------------------------------------
class CaptureError(ValueError):
    """A function that cannot be sent as a job (a closure, a lambda, a method, no source)."""


def unwrap_remote(obj):
    """The plain function behind a ``@trainhub.remote`` wrapper (anything else: itself)."""
    return getattr(obj, "__trainhub_function__", obj)


def _installed(module: types.ModuleType | None) -> bool:
    """True for modules installed in the environment (site-packages, the standard library): the job
    imports them by name. Modules of the user's own files (and ``__main__``) are carried as source."""
    import sysconfig

    if module is None or module.__name__ == "__main__":
        return False
    path = getattr(module, "__file__", None)
    if path is None:  # built-in or namespace package
        return True
    path = os.path.realpath(path)
    roots = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(root and path.startswith(os.path.realpath(root) + os.sep) for root in roots) or \
        "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep)


def _function_source(obj) -> str:
    """Source of a top-level function or class, without its ``@...remote(...)`` decorators."""
    src = textwrap.dedent(inspect.getsource(obj))
    stmt = ast.parse(src).body[0]
    drop: set[int] = set()
    for d in getattr(stmt, "decorator_list", []):
        if _is_remote_decorator(d):
            drop.update(range(d.lineno - 1, d.end_lineno))  # the '@' is on the expression's first line
    return "\n".join(ln for i, ln in enumerate(src.splitlines()) if i not in drop).rstrip()


def _is_remote_decorator(node: ast.AST) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Attribute) and target.attr == "remote") or (isinstance(target, ast.Name) and target.id == "remote")


def build_function_script(fn, args: tuple = (), kwargs: dict | None = None, *,
                          max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES, history: list[str] | None = None,
                          transform=None) -> JobScript:
    """A job script that calls ``fn(*args, **kwargs)`` and sends its value back (rank 0).

    A function of an installed module (site-packages) is imported by name in the job. One of the
    program's own files or of ``__main__`` (a script, a notebook) is carried as source together with
    the functions and classes of its module that it uses, the modules it uses become imports and other
    globals are pickled (at most ``max_value_bytes`` each), as ``%%train`` does for a cell. The
    arguments are pickled too. Raises :class:`CaptureError` for what cannot be sent (closures,
    lambdas, methods, functions without source); values that cannot be sent are in ``left_out``.

    ``history`` (and ``transform``): in a notebook, the cells run so far, as for ``%%train``: where
    ``inspect`` finds no source (classes defined in cells), the definition is taken from there.
    """
    kwargs = dict(kwargs or {})
    given = unwrap_remote(fn)
    try:  # a decorated function (functools.wraps, lru_cache): the def under it, carried with its decorators
        fn = inspect.unwrap(given) if callable(given) else given
    except ValueError:
        fn = given
    if not isinstance(fn, types.FunctionType):
        raise CaptureError(f"@trainhub.remote needs a plain function, not {type(given).__name__}")
    name = fn.__name__
    if fn.__name__ == "<lambda>" or "<locals>" in fn.__qualname__ or "." in fn.__qualname__:
        raise CaptureError(f"{fn.__qualname__}: only functions defined at the top level of a module or notebook cell can "
                           "run as a job (not lambdas, nested functions or methods)")
    module = sys.modules.get(fn.__module__)
    # a module written with postponed annotations: its functions are carried with them postponed too
    future = ["annotations"] if fn.__code__.co_flags & __future__.annotations.compiler_flag else []
    call_args = (args, kwargs)
    try:
        args_data, args_main = pickle_value(call_args)
    except Exception as e:
        raise CaptureError(f"the arguments of {name}() cannot be pickled ({type(e).__name__}: {str(e)[:120]}); "
                           "pass data through storage instead (a path in $TRAINHUB_STORAGE_URL)") from None
    if len(args_data) > max_value_bytes:
        raise CaptureError(f"the arguments of {name}() are {fmt_size(len(args_data))} pickled, over the "
                           f"{fmt_size(max_value_bytes)} limit: pass data through storage instead")
    if _installed(module) and not args_main:
        body = (f"import base64 as _th_b64, importlib as _th_il, pickle as _th_pickle\n_th_fn = _th_il.import_module({fn.__module__!r}).{name}\n"
                f"_th_fn = getattr(_th_fn, '__trainhub_function__', _th_fn)\n")
        r = Resolved()
        call = "_th_fn"
    else:
        ns = fn.__globals__
        mod_name = fn.__module__
        cells = collect_definitions(history, transform) if history and mod_name == "__main__" else {}

        def definition_of(n: str) -> Definition | None:
            d = _live_definition(n)
            if d is None and cells.get(n) is not None and cells[n].kind in ("def", "class"):
                d = cells[n]
            return d

        def _live_definition(n: str) -> Definition | None:
            obj = fn if n == name else ns.get(n)
            if obj is not None and not isinstance(obj, type):
                try:  # decorated functions (functools.wraps, lru_cache, @trainhub.remote): the def under the decorators
                    obj = inspect.unwrap(obj)
                except ValueError:
                    return None
            if not isinstance(obj, (types.FunctionType, type)) or getattr(obj, "__module__", None) != mod_name:
                return None
            if isinstance(obj, types.FunctionType) and (obj.__name__ == "<lambda>" or obj.__code__.co_freevars):
                return None
            if obj.__name__ != n or "." in obj.__qualname__:
                return None
            try:
                src = _function_source(obj)
            except (OSError, TypeError, SyntaxError):
                return None
            return Definition(n, src, (0, 0), "class" if isinstance(obj, type) else "def")

        if fn.__code__.co_freevars:
            raise CaptureError(f"{name} uses variables of an enclosing function ({', '.join(fn.__code__.co_freevars)}): "
                               "define it at the top level of its module or cell")
        if definition_of(name) is None:
            raise CaptureError(f"the source of {name} cannot be found (inspect.getsource failed): define it in a file "
                               "or a notebook cell")
        r = resolve_context({name} | args_main, definition_of, ns, max_value_bytes=max_value_bytes,
                            postponed=bool(future))
        body = "import base64 as _th_b64, pickle as _th_pickle\n"
        call = name
    body += f"_th_args, _th_kwargs = {unpickle_expression(call_args)}\ndel _th_b64, _th_pickle\n"
    body += (f"import trainhub.results as _th_results\n"
             f"_th_results.send({{'return': {call}(*_th_args, **_th_kwargs)}})\n")
    order = _topological(r.carried)
    source = render_script(body, r, header=f"generated by @trainhub.remote for {fn.__module__}.{name}",
                           body_title=f"the call: {name}(...), its value sent back", order=order,
                           origin=f"module {fn.__module__}", future=future)
    return JobScript(source=source, carried_code=sorted(r.carried),
                     carried_values={k: n for k, (_, n) in r.values.items()}, left_out=r.left_out,
                     undefined=r.undefined)


def _topological(carried: dict[str, Definition]) -> list[Definition]:
    """Carried definitions with what each needs at definition time (bases, decorators) first."""
    out: list[Definition] = []
    state: dict[str, int] = {}

    def visit(n: str) -> None:
        if state.get(n):
            return
        state[n] = 1
        try:
            deps = free_names(carried[n].source)
        except SyntaxError:
            deps = set()
        for dep in sorted(deps & set(carried)):
            if dep != n:
                visit(dep)
        out.append(carried[n])

    for n in sorted(carried, key=lambda k: (carried[k].kind not in ("import", "const"), k)):
        visit(n)
    return out
