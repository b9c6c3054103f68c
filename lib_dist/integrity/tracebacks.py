"""Tracebacks in the judge without frames.

The judge hands no frame object to anyone (`lockdown`), and Python's `traceback` module walks a
traceback's frames to format it: `SimulatedWorld` formats a rank's error that way, and so do
logging and the tests' own messages. `frameless()` makes the module's two walkers read only each
entry's code object and line, with code the lockdown trusts (by identity: `frameless` returns
it), and hand on stand-ins that carry those and nothing else (empty globals and locals):
formatting works as before, while no frame leaves the walker. It runs before the judge's
lockdown and seal, which then keep it in place.
"""

from __future__ import annotations

import traceback
import types
from collections.abc import Iterator
from typing import Any

EMPTY: dict[str, Any] = {}


class FrameSummary:
    """What `traceback` reads of a frame: its code, and no globals or locals."""

    __slots__ = ("f_code", "f_lineno")

    def __init__(self, code: types.CodeType, lineno: int):
        self.f_code, self.f_lineno = code, lineno

    @property
    def f_globals(self) -> dict[str, Any]:
        return {}

    @property
    def f_locals(self) -> dict[str, Any]:
        return {}


def frameless() -> list[types.CodeType]:
    """Point `traceback.walk_tb` and its positions twin at frameless walkers; the code that
    reads the frames, for the lockdown to trust."""
    traceback_type, type_ = types.TracebackType, type
    position = traceback._get_code_position  # type: ignore[attr-defined]

    def entries(tb: Any) -> list[tuple[types.CodeType, int, int]]:
        found, left = [], 1000
        while type_(tb) is traceback_type and left:
            found.append((tb.tb_frame.f_code, tb.tb_lineno, tb.tb_lasti))
            tb, left = tb.tb_next, left - 1
        return found

    def walk_tb(tb: Any) -> Iterator[tuple[FrameSummary, int]]:
        for code, lineno, _ in entries(tb):
            yield FrameSummary(code, lineno), lineno

    def walk_with_positions(tb: Any) -> Iterator[tuple[FrameSummary, tuple[Any, ...]]]:
        for code, lineno, lasti in entries(tb):
            positions = position(code, lasti)
            yield FrameSummary(code, lineno), ((lineno,) + positions[1:]
                                               if positions[0] is None else positions)

    traceback.walk_tb = walk_tb  # type: ignore[assignment]
    traceback._walk_tb_with_full_positions = walk_with_positions  # type: ignore[attr-defined]
    return [entries.__code__]


__all__ = ["frameless"]
