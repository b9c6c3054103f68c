"""What graded tests rely on, and a fingerprint of it that any change shows in.

Tests compare a student's results with torch's, call Python's builtins and lib_dist, and use
helpers that the lab's locked cells define. A `Snapshot` records, for each of those namespaces
(modules, classes), which object every name is bound to; `changes()` names every binding that
differs since, including one set through `__dict__`, and every module that `sys.modules` no
longer maps to the object it held.
"""

from __future__ import annotations

import builtins
import importlib
import math
import operator
import pkgutil
import sys
import types
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

from .versions import Versions

# Builtins that IPython itself rebinds while running cells: not something tests compare with.
KERNEL_MANAGED = frozenset({"builtins.exit", "builtins.quit", "builtins.get_ipython",
                            "builtins.input", "builtins.display", "builtins._", "builtins.__",
                            "builtins.___"})

# lib_dist's own module state that its API changes by design: `hvd.init()` binds the process's
# Horovod state. A student may call it (the lab allows `hvd.allreduce_`); no test reads it.
RUNTIME_STATE = frozenset({"lib_dist.horovod.basics._state",
                           "lib_dist.horovod.basics._exit_registered"})
UNWATCHED = KERNEL_MANAGED | RUNTIME_STATE

# What Python and torch write into a class on their own: copyreg stores a class's slot names in
# it the first time one of its instances is pickled (a tensor sent to the engines); torch's DDP
# (an oracle of lab 4, so watched) notes on its class the instance whose forward is running.
CLASS_CACHES = frozenset({"__slotnames__", "_active_ddp_module"})

# torch rebinds a few of its functions when a module is first imported, wrapping them:
# name -> the module whose import does it. Such a change is accepted, once.
LAZY_REBINDINGS = {"torch.manual_seed": "torch._dynamo"}

TRUSTED_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.nn.modules.module",
                   "torch.testing", "torch.distributed", "torch.autograd", "torch.optim",
                   "torch.utils.data", "numpy", "numpy.testing",
                   "os", "random")  # os.urandom: where hidden tests draw their seeds


def trusted_modules() -> list[types.ModuleType]:
    """builtins, math, operator, torch's modules that tests use, and every lib_dist module
    (imported now, so that a later import is a re-import)."""
    import lib_dist

    modules = [builtins, math, operator]
    modules += [importlib.import_module(name) for name in TRUSTED_MODULES]
    for info in pkgutil.walk_packages(lib_dist.__path__, "lib_dist."):
        if not info.name.endswith("__main__"):
            modules.append(importlib.import_module(info.name))
    return [lib_dist, *modules]


def classes_of(modules: list[types.ModuleType], also: Iterable[type] = ()) -> list[type]:
    """The classes a test may call methods of: torch's tensor, module, parameter, autograd
    function and optimizer, every class defined in lib_dist, and `also` (the lab's oracles)."""
    import torch

    found: list[type] = [torch.Tensor, torch.nn.Module, torch.nn.Parameter,
                         torch.autograd.Function, torch.optim.Optimizer, *also]
    for module in modules:
        if module.__name__.startswith("lib_dist"):
            found += [v for v in vars(module).values()
                      if isinstance(v, type) and v.__module__ == module.__name__]
    return list({id(c): c for c in found}.values())


class Snapshot:
    """The bindings of `modules` and `classes` as they are now, by identity."""

    def __init__(self, modules: list[types.ModuleType], classes: list[type]):
        self.modules = {m.__name__: m for m in modules}
        self.classes = classes
        self.bindings = dict(self._bindings())
        self._namespaces = [vars(m) for m in modules] + [vars(c) for c in classes]
        self._modules = list(self.modules.values())
        self._fingerprint = self._fingerprints()
        self._sys_modules = sys.modules
        self._versions = Versions([*self._namespaces, sys.modules])
        if not self._same_objects():  # a module not (or no longer) in sys.modules
            self._versions.remember(None)

    def _fingerprints(self) -> tuple[list[int], list[Any]]:
        """Each namespace's length, and every namespace's values one after another."""
        return (list(map(len, self._namespaces)),
                list(chain.from_iterable(map(_values, self._namespaces))))

    def _unchanged(self) -> bool:
        """The quick check, run each time an answer returns: no namespace was written to since
        the last time every binding was found to be the object it was (`Versions`, tens of
        microseconds), or else every binding is that object now (~0.7 ms for ~10,000)."""
        if sys.modules is self._sys_modules and self._versions.unchanged():
            return True
        written = self._versions.now()
        if not self._same_objects():
            return False
        self._versions.remember(written)  # written to, but every binding is what it was
        return True

    def _same_objects(self) -> bool:
        """Every binding is the object it was. By identity (`operator.is_`), not equality,
        which a value's own __eq__ could fake; and not through `id()`, which an audit hook
        hears every call of. Equal lengths make the values line up namespace by namespace; the
        loops are the interpreter's own (map, chain), not Python's."""
        lengths, values = self._fingerprint
        return (list(map(len, self._namespaces)) == lengths
                and all(map(operator.is_, chain.from_iterable(map(_values, self._namespaces)),
                            values))
                and all(map(operator.is_, map(sys.modules.get, self.modules), self._modules)))

    def _bindings(self) -> Iterator[tuple[str, Any]]:
        for name, module in self.modules.items():
            for key, value in list(vars(module).items()):
                qualified = f"{name}.{key}"
                if not issubclass(type(value), types.ModuleType) and qualified not in UNWATCHED:
                    yield qualified, value  # (submodules appear as they are imported)
        for cls in self.classes:
            for key, value in list(vars(cls).items()):
                if key not in CLASS_CACHES:
                    yield f"{cls.__module__}.{cls.__qualname__}.{key}", value

    def changes(self) -> list[str]:
        """Every binding added, removed or rebound since the snapshot, and every module that
        was replaced in sys.modules."""
        if self._unchanged():
            return []
        now = dict(self._bindings())
        self._accept_lazy_rebindings(now)
        changed = [name for name, value in self.bindings.items()
                   if now.get(name, _MISSING) is not value]
        changed += [name for name in now if name not in self.bindings]
        changed += [f"sys.modules[{name!r}]" for name, module in self.modules.items()
                    if sys.modules.get(name) is not module]
        if not changed:  # only submodules imported, or torch's own lazy rebinding
            written = self._versions.now()
            self._fingerprint = self._fingerprints()
            self._versions.remember(written)
        return sorted(changed)

    def _accept_lazy_rebindings(self, now: dict[str, Any]) -> None:
        for name, importer in LAZY_REBINDINGS.items():
            old, new = self.bindings.get(name), now.get(name)
            if (new is not old and importer in sys.modules
                    and getattr(new, "__wrapped__", None) is old):
                self.bindings[name] = new


def namespace_changes(before: dict[str, Any], namespace: dict[str, Any],
                      allowed: set[str]) -> list[str]:
    """Names of `namespace` rebound or removed since `before` (a copy of it), except `allowed`."""
    return sorted(name for name, value in before.items()
                  if name not in allowed and namespace.get(name, _MISSING) is not value)


_MISSING = object()
_values = operator.methodcaller("values")  # of a module's dict or a class's mappingproxy
