"""The judge's own check that nothing the tests rely on was rebound: the guard's snapshot,
again, as closures that student code cannot rebind.

The guard (`guard.Guard`, `snapshot.Snapshot`) checks through methods, which live on classes a
submission can reach and rebind (`Snapshot.changes = ...`). The seal takes the same namespaces
(modules and classes) and holds each one's bindings, by identity, inside closures made before
any student code ran, calling only builtins it captured then. The judge asks it after every
graded cell; the guard's findings say what changed, the seal makes sure a change is not
missed because the checker itself was changed.
"""

from __future__ import annotations

import builtins
import operator
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def seal(namespaces: Iterable[tuple[str, Mapping[str, Any]]], ignored: Iterable[str] = (),
         ignored_keys: Iterable[str] = (), lazy: Iterable[str] = ()) -> Callable[[], list[str]]:
    """A function listing what changed in `namespaces` (label, live mapping) since now:
    bindings rebound or removed, and new bindings that are not modules (a submodule imported
    later is not a change). Skipped: the qualified names in `ignored` and the keys in
    `ignored_keys` (what Python, IPython and torch change by themselves); a name in `lazy` may
    be rebound once to a wrapper of what it was (torch wraps a few of its functions lazily)."""
    is_, len_, list_, map_, all_, dict_ = (operator.is_, builtins.len, builtins.list,
                                           builtins.map, builtins.all, builtins.dict)
    isinstance_, getattr_ = builtins.isinstance, builtins.getattr
    module_type, skip, skip_keys = types.ModuleType, frozenset(ignored), frozenset(ignored_keys)
    wrapped_ok = frozenset(lazy)
    held = [(label, ns, dict_(ns), list_(ns.values())) for label, ns in namespaces]

    def changes() -> list[str]:
        found = []
        for label, ns, bindings, values in held:
            if len_(ns) == len_(values) and all_(map_(is_, ns.values(), values)):
                continue  # the quick check: every binding is the object it was
            now = dict_(ns)
            for name, value in bindings.items():
                qualified = f"{label}.{name}"
                if qualified in skip or name in skip_keys:
                    continue
                new = now.get(name, _MISSING)
                if not is_(new, value) and not (qualified in wrapped_ok and is_(
                        getattr_(new, "__wrapped__", None), value)):
                    found.append(qualified)
            for name, value in now.items():
                if (name not in bindings and f"{label}.{name}" not in skip
                        and name not in skip_keys and not isinstance_(value, module_type)):
                    found.append(f"{label}.{name}")
        return found

    return changes


_MISSING = object()


def rebinding_check() -> Callable[[dict[str, Any], dict[str, Any], frozenset[str]], list[str]]:
    """A function listing the names of `namespace` (the locked cells') rebound or removed
    since `before` (the judge's copy of it), except those `allowed` (what the cell binds and
    the answers). A name that is not a plain `str` is a change in itself: looking it up would
    run its class's `__eq__`."""
    is_, dict_, type_, str_ = operator.is_, builtins.dict, builtins.type, builtins.str

    def rebound(before: dict[str, Any], namespace: dict[str, Any],
                allowed: frozenset[str]) -> list[str]:
        now = dict_(namespace)
        odd = [f"a name of type {type_(name).__name__}" for name in now
               if not is_(type_(name), str_)]
        if odd:
            return odd
        return [name for name, value in before.items()
                if name not in allowed and not is_(now.get(name, _MISSING), value)]

    return rebound


def seal_callables(namespaces: Iterable[tuple[str, Mapping[str, Any]]],
                   lazy: Iterable[str] = ()) -> Callable[[], list[str]]:
    """A looser seal, for the many modules the tests reach through torch's and Python's own
    code (`torch.testing._comparison`, `ast`, ...): a function or class rebound or removed is
    a change, and so is a new binding that shadows a builtin (a module's `len`); their other
    state (caches, flags, counters) may change by itself."""
    is_, len_, list_, map_, all_, dict_ = (operator.is_, builtins.len, builtins.list,
                                           builtins.map, builtins.all, builtins.dict)
    callable_, isinstance_, module_type = builtins.callable, builtins.isinstance, types.ModuleType
    shadowed, wrapped_ok, getattr_ = frozenset(vars(builtins)), frozenset(lazy), builtins.getattr
    held = [(label, ns, {k: v for k, v in ns.items() if callable_(v)}, list_(ns.values()),
             frozenset(ns)) for label, ns in namespaces]

    def changes() -> list[str]:
        found = []
        for label, ns, functions, values, names in held:
            if len_(ns) == len_(values) and all_(map_(is_, ns.values(), values)):
                continue
            now = dict_(ns)
            for name, value in functions.items():
                new = now.get(name, _MISSING)
                if not is_(new, value) and not (f"{label}.{name}" in wrapped_ok and is_(
                        getattr_(new, "__wrapped__", None), value)):
                    found.append(f"{label}.{name}")
            found += [f"{label}.{name}" for name, value in now.items()
                      if name in shadowed and name not in names
                      and not isinstance_(value, module_type) and not name.startswith("__")]
        return found

    return changes


__all__ = ["rebinding_check", "seal", "seal_callables"]
