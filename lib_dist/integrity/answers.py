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


def require_plain(result: Any, name: str) -> None:
    """Tensors in what an answer returns must be torch.Tensor itself (or a Parameter)."""
    if isinstance(result, torch.Tensor) and type(result) not in _PLAIN:
        raise Tampering(f"{name} returned a {type(result).__qualname__}, a subclass of "
                        f"torch.Tensor; return a plain torch.Tensor")
    if isinstance(result, (list, tuple)):
        for item in result:
            require_plain(item, name)
    elif isinstance(result, dict):
        for item in result.values():
            require_plain(item, name)


__all__ = ["Resumed", "Tampering", "checked", "checked_class", "defined_in", "refusing",
           "require_plain"]
