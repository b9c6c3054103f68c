"""While a lab is graded, the student's code may not use what the tests compare it with.

`stubs.taken_from_oracle` refuses an answer that is one of the lab's oracles
(`lib_dist.extend.LABS`) or subclasses one. An answer can also use one inside its own code: a
`ShardSampler` whose `__iter__` builds torch's `DistributedSampler` and hands out its indices,
an `SGD` whose `update` steps a `torch.optim.SGD` of its own. This module refuses that:

- The guard's answer wrappers (`answers.checked`) note, on a stack of this thread's own, which
  answer is running (`enter`, `leave`). "Inside the student's code" is per thread: the ranks of
  a `SimulatedWorld` are threads, and a test may build an oracle on one thread while an answer
  runs on another.
- `guard_oracles(lab)` changes each oracle class in place, once per process. Inside an answer,
  its `__new__` and `__init__` raise `UsesOracle`: `__new__` covers too a subclass that
  overrides `__init__`, `copy.copy` and unpickling. Every other method of its own raises there
  unless called on an instance made outside any answer: the optimizer a test hands to
  `accumulated_step` still steps, while `DistributedSampler.__iter__(self)` on the student's own
  object, or borrowed as `__iter__ = DistributedSampler.__iter__`, does not. A function oracle
  is rebound, where it is defined, to one that raises inside an answer; a kernel of torch's
  (GradScaler's), in torch's dispatcher too (`kernels`), which every alias passes through.
- It runs where `stubs` does: when lib_dist is imported in the graded kernel and on each of its
  engines (answers sent to engines carry their wrappers, so the stack is kept there too), and
  when the guard arms, before its snapshot, which then watches the oracle classes: undoing this
  is tampering.

Outside answers the oracles behave as before: the tests build and call them freely.
"""

from __future__ import annotations

import functools
import importlib
import threading
import types
import weakref
from typing import Any, Callable

from ..extend import LABS
from .stubs import AskedToWrite, guards, lookup

_running = threading.local()  # .answers: the answers running on this thread, outermost first
_guarded: set[str] = set()  # oracles guarded in this process
_made: dict[int, weakref.ref[Any]] = {}  # instances of oracle classes made outside any answer
_NOT_GUARDED = frozenset({"__init__", "__del__"})  # __init__ apart; __del__ runs at any time


class UsesOracle(AskedToWrite):
    """Raised when the student's code uses, inside an answer, what the tests compare it with."""


def enter(answer: str) -> None:
    """The answer named `answer` starts running on this thread."""
    stack = getattr(_running, "answers", None)
    if stack is None:
        stack = _running.answers = []
    stack.append(answer)


def leave() -> None:
    _running.answers.pop()


def inside_answer() -> bool:
    """Whether the student's code is running on this thread."""
    return bool(getattr(_running, "answers", None))


def guard_oracles(lab: str) -> list[str]:
    """Guard every oracle `lab` declares (see the module docstring); their dotted names."""
    done = []
    for oracle in LABS[lab].oracles:
        dotted = oracle.replace(":", ".")
        if oracle not in _guarded:
            refuse = functools.partial(_refuse, lab, dotted)
            target = lookup(oracle)
            if isinstance(target, type):
                _guard_class(target, refuse)
            else:
                _guard_function(oracle, target, refuse)
                if oracle.startswith("torch:"):  # aten's other names for it: `kernels`
                    from .kernels import guard_kernel

                    guard_kernel(oracle.partition(":")[2], refuse)
            _guarded.add(oracle)
        done.append(dotted)
    return done


def watched(lab: str) -> tuple[list[types.ModuleType], list[type]]:
    """Where `lab`'s guarded oracles are bound, for the guard's snapshot: the modules (or
    classes) that hold its functions, and its classes."""
    modules: list[types.ModuleType] = []
    classes: list[type] = []
    for oracle in LABS[lab].oracles:
        module_name, _, qualname = oracle.partition(":")
        target = lookup(oracle)
        owner = target if isinstance(target, type) else _owner(module_name, qualname)
        if isinstance(owner, type):
            classes.append(owner)
        else:
            modules.append(owner)
    return modules, classes


def _refuse(lab: str, oracle: str) -> None:
    stack = getattr(_running, "answers", None)
    if stack:
        raise UsesOracle(f"{lab} asks you to write {stack[0].split('.')[0]} yourself: {oracle} "
                         f"is what the tests compare with, so your code may not use it")


def _guard_class(cls: type, refuse: Callable[[], None]) -> None:
    _settle(cls)
    for name, value in list(vars(cls).items()):
        if isinstance(value, types.FunctionType) and name not in _NOT_GUARDED:
            setattr(cls, name, _guarded_method(value, cls, refuse))
    init: Callable[..., None] = getattr(cls, "__init__")  # its own or inherited

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        refuse()
        init(self) if init is object.__init__ else init(self, *args, **kwargs)

    new: Callable[..., Any] = getattr(cls, "__new__")

    @functools.wraps(new)
    def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
        refuse()  # so what is made here is made outside any answer
        made = new(klass) if new is object.__new__ else new(klass, *args, **kwargs)
        _remember(made)
        return made

    _hide(__init__, init)
    _hide(__new__, new)
    cls.__init__ = __init__  # type: ignore[misc]
    cls.__new__ = staticmethod(__new__)  # type: ignore[assignment]


def _guarded_method(method: Callable[..., Any], cls: type,
                    refuse: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if inside_answer() and not _made_outside(self, cls):
            refuse()
        return method(self, *args, **kwargs)

    _hide(guarded, method)
    return guarded


def _guard_function(oracle: str, function: Callable[..., Any],
                    refuse: Callable[[], None]) -> None:
    module_name, _, qualname = oracle.partition(":")
    owner, name = _owner(module_name, qualname), qualname.rpartition(".")[2]

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        refuse()
        return function(*args, **kwargs)

    _hide(guarded, function)
    raw = vars(owner).get(name)
    setattr(owner, name, type(raw)(guarded) if isinstance(raw, (staticmethod, classmethod))
            else guarded)


def _hide(guard: Callable[..., Any], original: Callable[..., Any]) -> None:
    """`guard` looks like `original` (name, docstring), but `inspect.unwrap` stops at it: no
    `__wrapped__` leads past the guard."""
    vars(guard).pop("__wrapped__", None)
    if isinstance(original, types.FunctionType):
        guards(guard, original)


def _owner(module_name: str, qualname: str) -> Any:
    """The module or class in which "module:qualname" is bound."""
    path = qualname.rpartition(".")[0]
    return lookup(f"{module_name}:{path}") if path else importlib.import_module(module_name)


def _settle(cls: type) -> None:
    """torch wraps an optimizer class's `step` for its profiler when the first one is made
    (`torch.optim.Optimizer._patch_step_function`, which rebinds `cls.step`); done here, as
    torch does it, so that it is done before the guard's snapshot and not taken for tampering."""
    import torch

    if issubclass(cls, torch.optim.Optimizer) and not getattr(cls.step, "hooked", None):
        step = torch.optim.Optimizer.profile_hook_step(cls.step)
        step.hooked = True  # type: ignore[attr-defined]
        cls.step = step  # type: ignore[method-assign]


def _remember(made: Any) -> None:
    key = id(made)

    def forget(ref: weakref.ref[Any]) -> None:
        if _made.get(key) is ref:
            del _made[key]

    try:
        _made[key] = weakref.ref(made, forget)
    except TypeError:  # no weak references to it: `_made_outside` goes by its class
        pass


def _made_outside(obj: Any, cls: type) -> bool:
    """Whether `obj` is a `cls` made outside any answer (by the guarded `__new__`)."""
    if not isinstance(obj, cls):
        return False
    ref = _made.get(id(obj))
    if ref is not None:
        return ref() is obj
    try:
        weakref.ref(obj)
    except TypeError:  # not remembered: its class is all there is to go by
        return True
    return False


__all__ = ["UsesOracle", "enter", "guard_oracles", "inside_answer", "leave", "watched"]
