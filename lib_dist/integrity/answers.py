"""The student's answers as the graded kernel's guard hands them to the tests: wrapped, so that
it is known when the student's code runs.

Each function a lab asks for, and each method of a class it asks for and of the student's own
classes that class builds on, is wrapped by `checked`. While one runs, `oracles` knows that the
student's code is running on this thread, and refuses it the lab's oracles. When it returns to
code that is not the student's, the armed guard checks that nothing the tests rely on changed
(`guard.Guard`) and that it returned plain tensors.

A generator an answer returns (an `__iter__` written with `yield`), and the generator behind a
context manager it returns (`@contextlib.contextmanager def no_sync`), run the student's code
each time they resume, after the answer returned: each resumption counts as the answer running.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any, Callable

import torch

from . import current, oracles
from .stubs import AskedToWrite

_WRAPPERS: dict[int, Callable[..., Any]] = {}  # id -> wrapper, kept alive
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class Tampering(AssertionError):
    """Something the tests rely on was changed while the student's code ran."""


def checked(fn: Callable[..., Any], name: str, guard: int) -> Callable[..., Any]:
    """`fn`, run as the answer `name`, checked by the guard whose id is `guard` each time it
    returns to code that is not the student's (see `guard.Guard`). It names only module-level
    functions, which cloudpickle sends to engines by reference."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _answering(guard, name, fn, args, kwargs)

    _WRAPPERS[id(wrapper)] = wrapper
    return wrapper


def checked_class(cls: type, name: str, guard: int, students: Callable[[type], bool]) -> type:
    """Wrap in place (once) the methods of `cls` and of the classes it builds on that are
    `students` (their methods would otherwise run unwrapped)."""
    _known_classes.update(k for k in cls.__mro__ if k is cls or students(k))
    for klass in cls.__mro__:
        if klass is cls or (klass is not object and students(klass)):
            for attr, value in list(vars(klass).items()):
                if isinstance(value, (staticmethod, classmethod)):
                    if id(value.__func__) not in _WRAPPERS:
                        wrapped = checked(value.__func__, f"{name}.{attr}", guard)
                        setattr(klass, attr, type(value)(wrapped))
                elif isinstance(value, types.FunctionType) and id(value) not in _WRAPPERS:
                    setattr(klass, attr, checked(value, f"{name}.{attr}", guard))
    return cls


def defined_in(cls: type, namespace: dict[str, Any]) -> bool:
    """Whether `cls` has a method whose globals are `namespace` (the notebook's)."""
    for value in vars(cls).values():
        function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if getattr(function, "__globals__", None) is namespace:
            return True
    return False


def refusing(message: str) -> Callable[..., Any]:
    """A stand-in for an answer that is not taken: calling it, or reading any attribute of it
    (a class's `apply`, its `__name__`), raises AskedToWrite(message)."""
    return Refused(message)


class Refused:
    """See `refusing`."""

    def __init__(self, message: str):
        object.__setattr__(self, "_message", message)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AskedToWrite(self._message)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name not in ("__name__", "__qualname__"):
            raise AttributeError(name)  # what pickling and copying look for
        raise AskedToWrite(self._message)

    def __repr__(self) -> str:
        return f"<refused: {self._message}>"


class Resumed:
    """A generator the student's code returned: each resumption runs as the answer `name`."""

    def __init__(self, guard: int, name: str, generator: types.GeneratorType[Any, Any, Any]):
        self.guard, self.name, self.generator = guard, name, generator

    def __iter__(self) -> Resumed:
        return self

    def __next__(self) -> Any:
        return _answering(self.guard, self.name, self.generator.__next__, (), {})

    def send(self, value: Any) -> Any:
        return _answering(self.guard, self.name, self.generator.send, (value,), {})

    def throw(self, *args: Any) -> Any:
        return _answering(self.guard, self.name, self.generator.throw, args, {})

    def close(self) -> None:
        _answering(self.guard, self.name, self.generator.close, (), {})


def _answering(guard: int, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    oracles.enter(name)
    try:
        result = fn(*args, **kwargs)
    finally:
        oracles.leave()
    if isinstance(result, types.GeneratorType):
        result = Resumed(guard, name, result)
    elif (isinstance(result, contextlib._GeneratorContextManager)
          and isinstance(result.gen, types.GeneratorType)):
        result.gen = Resumed(guard, name, result.gen)
    return result if oracles.inside_answer() else _after_answer(guard, name, result)


def _after_answer(guard: int, name: str, result: Any) -> Any:
    checking = current.guard()
    if checking is not None and id(checking) == guard:  # on an engine, nothing is armed
        checking.raise_if_changed(f"when {name} returned")
        require_plain(result, name)
    return result


def require_plain(result: Any, name: str, depth: int = 0) -> None:
    """What an answer returns must compare as plain data: tensors that are torch.Tensor itself
    (or a Parameter, or one of torch's own subclasses), and no object whose class changes how it compares, counts or iterates
    (`__eq__` always true, a list whose `__len__` lies) unless that class is Python's,
    torch's or lib_dist's own, the lab's (`know_classes`), or one the lab asks for."""
    if depth > 8:
        return
    kind = type(result)
    if (isinstance(result, torch.Tensor) and kind not in _PLAIN
            and kind.__module__.split(".")[0] != "torch"):  # torch's DTensor and its kin
        raise Tampering(f"{name} returned a {kind.__qualname__}, a subclass of "
                        f"torch.Tensor; return a plain torch.Tensor")
    if kind not in _PLAIN and (changed := _changed_behaviour(kind)):
        raise Tampering(f"{name} returned a {kind.__qualname__}, whose class changes "
                        f"{', '.join(changed)}: return plain values (numbers, lists, tuples, "
                        f"dicts, tensors) or lib_dist's and torch's own objects")
    if kind in (list, tuple) or (isinstance(result, tuple) and not changed):
        for item in list(result)[:10_000]:
            require_plain(item, name, depth + 1)
    elif kind is dict:
        for item in list(result.values())[:10_000]:
            require_plain(item, name, depth + 1)


_TRUSTED_ROOTS = ("builtins", "torch", "lib_dist", "numpy", "collections", "typing")
_BEHAVIOUR = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__",
              "__iter__", "__getitem__", "__contains__", "__hash__", "__float__", "__int__",
              "__index__", "__abs__", "__sub__", "__getattr__", "__getattribute__")
_known_classes: set[type] = set()  # the lab's own classes and the answers that are classes


def know_classes(values: Any) -> None:
    """The classes among `values` (what a locked cell defined) are the lab's own: what an
    answer returns may be one of them."""
    _known_classes.update(v for v in values if isinstance(v, type))


def _changed_behaviour(kind: type) -> list[str]:
    """The comparison and container methods `kind` defines in a class that is neither
    Python's, torch's nor lib_dist's (empty for a namedtuple or torch.Size)."""
    if kind in _known_classes or kind.__module__.split(".")[0] in _TRUSTED_ROOTS:
        return []
    found = []
    for klass in kind.__mro__:
        if klass in _known_classes or klass.__module__.split(".")[0] in _TRUSTED_ROOTS:
            continue
        if issubclass(klass, tuple) and all(name not in vars(klass) for name in _BEHAVIOUR
                                            if name != "__getattr__"):
            continue  # a namedtuple: tuple's own comparisons
        found += [name for name in _BEHAVIOUR if name in vars(klass) and name not in found]
    return found

__all__ = ["Resumed", "Tampering", "checked", "checked_class", "defined_in", "know_classes",
           "refusing", "require_plain"]
