"""The guard armed in this judge, where the answers it wrapped find it when they return.

One guard per judge (`judge`, `guard.Guard`); none on an engine, where the answers run too. The
state is this module's own, set and read only through these functions, so neither `guard` nor
`answers` imports the other for it.
"""

from __future__ import annotations

from typing import Protocol


class Checking(Protocol):
    """What an answer needs of the guard when it returns (`guard.Guard`)."""

    def raise_if_changed(self, when: str) -> None: ...


_armed: Checking | None = None


def arm(guard: Checking) -> None:
    """Make `guard` the one this kernel's answers report to. Before the guard takes its
    snapshot, which watches this module too: rebinding `_armed` later is a change it reports."""
    global _armed
    _armed = guard


def guard() -> Checking | None:
    """The guard armed in this process, or None (on an engine, or anywhere but a judge)."""
    return _armed
