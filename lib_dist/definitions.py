"""Load named definitions from a notebook without running the rest of it.

`definitions(notebook, *names)` loads named top-level definitions from a notebook: the
functions, classes and assignments that bind those names, plus everything at top level they
use (other definitions, imports, constants), found by scope analysis (`symtable`), and runs
just those statements, in notebook order, in a fresh module. Nothing else in the notebook runs:
no cluster starts, no test executes, no file is written. A later lab reuses a student's own
earlier work this way, and tests and benchmarks load the instructor's solutions from
`solutions/`, so each solution exists once in the repository:

    ce = definitions("../lab01_cross_entropy/lab01_cross_entropy.ipynb", "cross_entropy",
                     fallback=lib_dist.losses)
    SGD, AdamW = definitions("solutions/lab02_training/lab02_training.ipynb", "SGD", "AdamW")

With `fallback` (a module or any object with those attributes), a name the notebook does not
provide is taken from it instead: when the notebook is missing, does not define the name, or
leaves it unanswered (a function, or a method of a class, whose body still raises
NotImplementedError as nbgrader's release leaves it; or a definition that uses one); and, for
every name, when running the selected code raises (`problem` says why). `origins` tells which
source each name came from. Module-level assignments a loaded definition reads are run with it,
so a definition should not read a global that starts something (a cluster, a training run).
"""

from __future__ import annotations

import ast
import json
import linecache
import symtable
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
FALLBACK = "fallback"


class MissingDefinition(LookupError):
    """The notebook does not provide a requested name, and there is no fallback."""


class Definitions:
    """The loaded names, as attributes (`defs.cross_entropy`), items (`defs["SGD"]`), or in the
    order requested (`SGD, AdamW = definitions(path, "SGD", "AdamW")`). `origins[name]` is the
    notebook's path, or "fallback"; `source` is the code that ran; `problem` is the error that
    running it raised, if it did and the fallback was used instead."""

    def __init__(self, values: dict[str, Any], origins: dict[str, str], source: str,
                 problem: str = ""):
        self._values, self.origins, self.source, self.problem = values, origins, source, problem

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values.values())

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return "Definitions(" + ", ".join(f"{n} from {o}" for n, o in self.origins.items()) + ")"


def definitions(notebook: str | Path, *names: str, fallback: Any = None) -> Definitions:
    """Load `names` from the top level of `notebook` without running its other cells.

    Raises `MissingDefinition` naming what is missing and what the notebook does define, unless
    `fallback` provides it. See the module docstring.
    """
    path = Path(notebook)
    cells = _code_cells(path) if path.is_file() else []
    return definitions_in(cells, *names, fallback=fallback, source_name=path)


def definitions_in(cells: list[str], *names: str, fallback: Any = None,
                   source_name: str | Path = "cells") -> Definitions:
    """`definitions`, from the sources of a notebook's code cells rather than its file (the
    judge loads a submission's answers from its own cells this way). `source_name` is the
    notebook's path or name, for messages and tracebacks."""
    if not names:
        raise TypeError("definitions() needs at least one name to load")
    path = Path(source_name)
    statements = _statements_of(cells)
    bound = _bindings(statements)
    found = [n for n in names if n in bound
             and not any(_unanswered(statements[i]) for i in _closure(statements, bound, [n]))]
    missing = [n for n in names if n not in found]
    if missing and fallback is None:
        raise MissingDefinition(f"{path}: no answered definition of {', '.join(missing)} "
                                f"({_what_it_defines(statements, bool(cells))})")
    source = "\n\n".join(ast.unparse(statements[i])
                          for i in sorted(_closure(statements, bound, found)))
    module, problem = types.ModuleType(f"notebook_{path.stem}"), ""
    if found:
        try:
            module = _run(source, path)
        except Exception as e:  # noqa: BLE001 - the student's code: report, then fall back
            if fallback is None:
                raise
            found, problem = [], f"{type(e).__name__}: {e}"
    values, origins = {}, {}
    for name in names:
        if name in found:
            values[name], origins[name] = module.__dict__[name], str(path)
        elif hasattr(fallback, name):
            values[name], origins[name] = getattr(fallback, name), FALLBACK
        else:
            raise MissingDefinition(f"{name!r} is neither answered in {path} nor provided by "
                                    f"the fallback {fallback!r}")
    return Definitions(values, origins, source, problem)


def _what_it_defines(statements: list[ast.stmt], any_cells: bool) -> str:
    if not any_cells:
        return "no such file, or no code cells"
    defined = sorted({s.name for s in statements if isinstance(s, DEFINITIONS)})
    return "it defines " + (", ".join(defined) if defined else "no function or class")


def _run(source: str, path: Path) -> types.ModuleType:
    """Execute `source` as a fresh module; tracebacks show its lines (via linecache).

    The module is compiled with the notebook's own `__future__` imports, not this file's. It
    is in `sys.modules` while it runs, as an imported module is: a `@dataclass` looks its
    class's module up there (for string annotations). Not after: what it defines is then
    pickled by value, as an engine that never loaded the notebook needs it."""
    filename = f"<definitions from {path}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(f"notebook_{path.stem}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    try:
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    finally:
        if sys.modules.get(module.__name__) is module:
            del sys.modules[module.__name__]
    return module


def _code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb.get("cells", []) if c.get("cell_type") == "code"]


def _statements_of(cells: list[str]) -> list[ast.stmt]:
    """Every top-level statement of the code cells, in order. Cell magics (%%px,
    %%time, ...) are skipped whole; line magics and shell escapes become plain calls, which
    bind nothing; a cell that does not parse is skipped."""
    statements = []
    for text in cells:
        if text.lstrip().startswith("%%"):
            continue
        try:
            statements += ast.parse(_without_magics(text)).body
        except SyntaxError:
            continue
    return statements


def _without_magics(text: str) -> str:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # no IPython: comment out magic and shell lines
        return "\n".join("# " + line if line.lstrip()[:1] in ("%", "!") else line
                         for line in text.splitlines())
    return TransformerManager().transform_cell(text)


def _bindings(statements: list[ast.stmt]) -> dict[str, int]:
    """name -> index of the last top-level statement that binds it (running the notebook top
    to bottom, the last binding wins)."""
    bound = {}
    for i, stmt in enumerate(statements):
        for name in _bound_names(stmt):
            bound[name] = i
    return bound


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, DEFINITIONS):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"]
    if isinstance(stmt, ast.Assign):
        return [n.id for t in stmt.targets for n in ast.walk(t)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]  # not `x[i] = ...`
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
        return [stmt.target.id]
    return []


def _closure(statements: list[ast.stmt], bound: dict[str, int], names: list[str]) -> set[int]:
    """Indices of the statements binding `names` and, transitively, every top-level name they
    use. `from __future__` and `from x import *` statements are always included: the first
    changes how the rest compiles, and what the second binds is unknown. Every import of a name
    is included, not only the last binding: a definition that needs `torch` as it is defined
    (a base class) finds the setup cell's import even where a later cell imports it again."""
    chosen = {i for i, s in enumerate(statements) if isinstance(s, ast.ImportFrom)
              and (s.module == "__future__" or any(a.name == "*" for a in s.names))}
    imports: dict[str, list[int]] = {}
    for i, stmt in enumerate(statements):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for name in _bound_names(stmt):
                imports.setdefault(name, []).append(i)
    todo = [bound[n] for n in names]
    while todo:
        i = todo.pop()
        if i in chosen:
            continue
        chosen.add(i)
        used = [n for n in _global_uses(statements[i]) if n in bound]
        todo += [bound[n] for n in used] + [j for n in used for j in imports.get(n, [])]
    return chosen


def _global_uses(stmt: ast.stmt) -> set[str]:
    """Names the statement reads from module scope: at top level (decorators, base classes,
    default values, right-hand sides) and inside any function or class body."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return set()
    table = symtable.symtable(ast.unparse(stmt), "<cell>", "exec")
    uses = {s.get_name() for s in table.get_symbols() if s.is_referenced()}
    return uses | set(_nested_globals(table))


def _nested_globals(table: symtable.SymbolTable) -> Iterator[str]:
    for child in table.get_children():
        for sym in child.get_symbols():
            if sym.is_global() and (sym.is_referenced() or sym.is_assigned()):
                yield sym.get_name()
        yield from _nested_globals(child)


def _unanswered(stmt: ast.stmt) -> bool:
    """A function, or a class with a method, whose body raises NotImplementedError at its top
    level: an exercise as nbgrader releases it, not yet answered."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return any(_raises_not_implemented(s) for s in stmt.body)
    if isinstance(stmt, ast.ClassDef):
        return any(_unanswered(s) for s in stmt.body)
    return False


def _raises_not_implemented(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
