"""The instructor's lab solutions, loaded from solutions/ the way a later lab loads a student's
earlier notebook (`lib_dist.extend.definitions`): each solution exists once, in its notebook.
A plain module, importable by any test."""

from __future__ import annotations

from pathlib import Path

from lib_dist.extend import Definitions, definitions

REPO = Path(__file__).resolve().parent.parent


def solution(lab: str, *names: str) -> Definitions:
    """`names` from solutions/<lab>/<lab>.ipynb."""
    return definitions(REPO / "solutions" / lab / f"{lab}.ipynb", *names)


def release(lab: str) -> Path:
    """The student's release of the lab, labs/<lab>/<lab>.ipynb."""
    return REPO / "labs" / lab / f"{lab}.ipynb"
