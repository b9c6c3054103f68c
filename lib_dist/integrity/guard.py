"""The graded kernel's guard: tests see the lab's own helpers and the student's answers, and
nothing the student's code changed.

The judge (`judge`) makes one guard before any student code runs in its process; for every
locked cell (setup, helpers, tests) it calls `Guard.begin`, runs the cell's code itself, seals,
then calls `Guard.after` (`Guard.run` does the three, for use outside the judge):

- Locked cells run in a namespace of their own, not the notebook's. Their helpers' globals are
  that namespace, so a student cell that rebinds `close` or `torch`, at top level or from
  inside a function, changes nothing a test sees. What they define is copied into the
  notebook's namespace too, for the student's own use.
- Before each locked cell, the names the lab asks for (`lib_dist.extend.LABS`) are copied in
  from the notebook, and nothing else of the student's. Functions are wrapped, and so are the
  methods of classes (`answers`): when an answer returns, the guard checks that torch,
  builtins, numpy, lib_dist, the locked namespace and the lab's oracles are bound exactly as
  before (a patch that restores itself after fooling one comparison is still in place when the
  answer returns), and that what it returned holds plain tensors (a subclass can make
  `torch.equal` answer yes). While an answer runs, the lab's oracles refuse to be used
  (`oracles`): the tests compare with them, so the student's code may not call them.
- Throughout, an audit hook (which nothing can remove) notes any re-import or re-execution of
  a lib_dist module (`importlib.reload`, a fresh import after deleting it from sys.modules,
  which would bring back what `stubs` switched off) and any change of a protected function's
  code. Such a copy could be used at any time after, so every later check reports it.

Each finding fails the cell that was running, with a message saying what changed: its points
are lost, and the grader says so in the feedback (`report`).
"""

from __future__ import annotations

import ast
import builtins
import linecache
import sys
import types
from collections.abc import Set
from typing import Any

from ..extend import LABS
from . import current
from .answers import Tampering, checked, checked_class, defined_in, know_classes, refusing
from .oracles import guard_oracles, watched
from .snapshot import Snapshot, classes_of, namespace_changes, trusted_modules
from .stubs import taken_from_oracle

_AUDITED = frozenset({"import", "exec", "object.__setattr__"})


class Guard:
    """See the module docstring. One per graded kernel."""


    def __init__(self, lab: str, notebook_namespace: dict[str, Any]):
        current.arm(self)
        self.lab_name, self.lab = lab, LABS[lab]
        self.user_ns = notebook_namespace
        self.ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        guard_oracles(lab)  # again (see `oracles`), and before the snapshot, which watches them
        modules, (oracle_modules, oracle_classes) = trusted_modules(), watched(lab)
        modules += [m for m in oracle_modules if m not in modules]
        self.snapshot = Snapshot(modules, classes_of(modules, oracle_classes))
        self.lib_files = {m.__file__ for m in modules
                          if m.__name__.startswith("lib_dist") and m.__file__}
        self.findings: dict[str, list[str]] = {}
        self.cell = "setup"
        self._before: dict[str, Any] = {}
        self._allowed: set[str] = set()
        self._heard: list[str] = []  # from the audit hook: reported by every later check
        sys.addaudithook(self._audit)

    # -- running locked cells ------------------------------------------------------------
    def run(self, source: str, cell: str, graded: bool = True) -> None:
        """Run a locked cell's `source` in the locked namespace (see the module docstring). A
        cell that is not `graded` (setup, helpers) runs whatever changed. The judge runs the
        code itself between `begin` and `after`, and checks in between with its own seal."""
        bound = bound_names(source)
        self.begin(cell, bound, graded)
        try:
            _exec_cell(source, f"<{cell}>", self.ns)
        finally:
            self.after(bound)
        if graded:
            self.raise_if_changed(f"while {cell} ran")

    def begin(self, cell: str, bound: Set[str], graded: bool) -> None:
        """Before a locked cell that binds `bound` runs: the answers copied in, wrapped."""
        self.cell = cell
        self.findings.setdefault(cell, [])
        if graded:
            self.raise_if_changed(f"before {cell} ran")
        self.ns.update({name: self._answer(name) for name in self.lab.asks
                        if name in self.user_ns})
        self._before, self._allowed = dict(self.ns), set(bound) | set(self.lab.asks)

    def after(self, bound: Set[str]) -> None:
        """After the cell ran, however it ended: what it defined is the notebook's too."""
        for name in bound & self.ns.keys():
            self.user_ns[name] = self.ns[name]
        self._note(namespace_changes(self._before, self.ns, self._allowed))
        self._before = dict(self.ns)
        know_classes(self._before.values())

    # -- checks ----------------------------------------------------------------------------
    def changes(self) -> list[str]:
        return (self.snapshot.changes() + list(self._heard)
                + namespace_changes(self._before, self.ns, self._allowed))

    def raise_if_changed(self, when: str) -> None:
        changed = self.changes()
        if changed:
            self._note(changed)
            raise Tampering(f"{when}, the submission had changed what the tests rely on: "
                            f"{_listed(changed)}. Tests compare against torch, Python's "
                            f"builtins, lib_dist and the lab's own helpers, so a change to "
                            f"them scores 0 here; leave them as they are.")

    def _note(self, changed: list[str]) -> None:
        seen = self.findings.setdefault(self.cell, [])
        seen += [c for c in changed if c not in seen]

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in _AUDITED:  # most events: every id(), open(), socket call...
            return
        heard = ""
        if event == "import" and str(args[0]).startswith("lib_dist"):
            heard = f"a second import of {args[0]}"
        elif event == "exec" and getattr(args[0], "co_filename", None) in self.lib_files:
            heard = f"a re-execution of {args[0].co_filename}"
        elif (event == "object.__setattr__" and args[1] == "__code__"
              and getattr(args[0], "__module__", "") in self._protected_modules()):
            heard = f"the code of {args[0].__module__}.{args[0].__qualname__}"
        if heard and heard not in self._heard:
            self._heard.append(heard)

    def _protected_modules(self) -> set[str]:
        return set(self.snapshot.modules) | {"__main__"}

    # -- the student's answers -------------------------------------------------------------
    def _answer(self, name: str) -> Any:
        value = self.user_ns[name]
        oracle = taken_from_oracle(self.lab_name, value)
        if oracle:
            return refusing(f"{self.lab_name} asks you to write {name} yourself: yours is "
                            f"{oracle}, or builds on it, and the tests compare with it")
        if isinstance(value, type) and value.__module__.split(".")[0] == "lib_dist":
            # wrapped in place, lib_dist's class would look tampered with to every later check
            return refusing(f"{self.lab_name} asks you to write {name} yourself: yours is "
                            f"{value.__module__}.{value.__qualname__}, lib_dist's own")
        if isinstance(value, type):
            return checked_class(value, name, id(self),
                                 lambda cls: defined_in(cls, self.user_ns))
        return checked(value, name, id(self)) if callable(value) else value


def bound_names(source: str) -> set[str]:
    """Names the cell's top-level statements bind."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _exec_cell(source: str, filename: str, namespace: dict[str, Any]) -> None:
    """Run a cell as IPython would: statements, then the value of a final expression shown."""
    body, last = compiled(source, filename)
    exec(body, namespace)  # noqa: S102
    if last is not None:
        shown(eval(last, namespace))  # noqa: S307


def compiled(source: str, filename: str) -> tuple[types.CodeType, types.CodeType | None]:
    """A cell's statements, and its final expression apart (IPython shows its value)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    return (compile(tree, filename, "exec"),
            None if last is None else compile(ast.Expression(last.value), filename, "eval"))


def shown(value: Any) -> None:
    """Display a cell's final value, as IPython would (None shows nothing)."""
    if value is not None:
        from IPython.display import display

        display(value)


def _listed(changed: list[str], most: int = 5) -> str:
    changed = sorted(changed, key=lambda name: "__" in name)  # dunders say least
    shown = ", ".join(changed[:most])
    return shown + (f" and {len(changed) - most} more" if len(changed) > most else "")


__all__ = ["Guard", "Tampering", "bound_names", "compiled", "shown"]
