"""Switch off lib_dist's own version of what a lab asks students to write.

Where a lab is graded, lib_dist is the grader's judged edition (`grader.edition`), in which each
reference the lab declares in `lib_dist.extend.LABS` has no body left; its
`integrity/edition.py` names the lab, and `lib_dist/__init__.py` then calls
`switch_off_references` too (as it does where LIB_DIST_GRADED_LAB names a lab, for tests): the
function keeps its name but its code object is replaced by one that raises `AskedToWrite`.
Every reference to the function changes at once, however it was reached: `from lib_dist.losses
import cross_entropy`, a module attribute, a table that holds the function (the tuner's
algorithms), or a function pickled by reference to an engine.
"""

from __future__ import annotations

import types
import weakref
from typing import Any, Callable

from ..extend import LABS
from ..references import lookup

GRADED_LAB = "LIB_DIST_GRADED_LAB"
# `oracles`' wrappers -> the function each one guards; kept here rather than on the wrapper
# (no `__wrapped__`), so that `inspect.unwrap` finds the guard, not what it guards
_guarded_by: weakref.WeakKeyDictionary[Callable[..., Any], types.FunctionType] = (
    weakref.WeakKeyDictionary())


def guards(wrapper: Callable[..., Any], original: types.FunctionType) -> None:
    """Note that `wrapper` guards `original` (for `resolve`)."""
    _guarded_by[wrapper] = original


class AskedToWrite(NotImplementedError):
    """Raised by lib_dist's version of something the lab being graded asks students to write."""


def switch_off_references(lab: str) -> list[str]:
    """Replace the body of every reference `lab` declares; return their dotted names."""
    if lab not in LABS:
        raise KeyError(f"{GRADED_LAB}={lab!r} names no lab (known: {', '.join(sorted(LABS))})")
    done = []
    for reference in LABS[lab].references:
        function = resolve(reference)
        dotted = reference.replace(":", ".")
        message = (f"{lab} asks you to write this yourself: {dotted} is lib_dist's own "
                   f"version, switched off while the lab is graded")
        function.__code__ = _raising_code(message, len(function.__code__.co_freevars))
        done.append(dotted)
    return done


def resolve(reference: str) -> types.FunctionType:
    """The function named by "package.module:Qual.name" (the one an oracle's guard wraps, where
    `oracles` guards it: lib_dist's `DataParallel.__init__` is a reference and an oracle's)."""
    obj = lookup(reference)
    while obj in _guarded_by:
        obj = _guarded_by[obj]
    if not isinstance(obj, types.FunctionType):
        raise TypeError(f"{reference} is a {type(obj).__name__}; a lab's references are "
                        f"functions or methods")
    return obj


def taken_from_oracle(lab: str, answer: Any) -> str | None:
    """The oracle of `lab` that `answer` is, or subclasses, if any, as "module.qualname"."""
    for oracle in LABS[lab].oracles:
        cls = lookup(oracle)
        if answer is cls or (isinstance(answer, type) and isinstance(cls, type)
                             and issubclass(answer, cls)):
            return oracle.replace(":", ".")
    return None


def _raising_code(message: str, free_variables: int) -> types.CodeType:
    """A code object that raises AskedToWrite(message), with as many free variables as the
    function it replaces has (Python requires the two to match)."""
    names = [f"_free{i}" for i in range(free_variables)]
    source = (
        "def outer():\n"
        + (f"    {' = '.join(names)} = None\n" if names else "")
        + "    def stub(*args, **kwargs):\n"
        + (f"        ({', '.join(names)},)\n" if names else "")
        + "        raise __import__('lib_dist.integrity.stubs', fromlist=['AskedToWrite'])"
        + f".AskedToWrite({message!r})\n"
        + "    return stub\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, "<lib_dist.integrity.stubs>", "exec"), namespace)  # noqa: S102
    return namespace["outer"]().__code__
