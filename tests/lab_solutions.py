"""The instructor's lab solutions, loaded from solutions/ the way a later lab loads a student's
earlier notebook (`lib_dist.extend.definitions`): each solution exists once, in its notebook.
A plain module, importable by any test."""

from __future__ import annotations

from pathlib import Path

import nbformat

from grader.synthetic import MARKERS
from lib_dist.extend import Definitions, definitions

REPO = Path(__file__).resolve().parent.parent


def solution(lab: str, *names: str) -> Definitions:
    """`names` from solutions/<lab>/<lab>.ipynb."""
    return definitions(REPO / "solutions" / lab / f"{lab}.ipynb", *names)


def release(lab: str) -> Path:
    """The student's release of the lab, labs/<lab>/<lab>.ipynb."""
    return REPO / "labs" / lab / f"{lab}.ipynb"


def answer_source(lab: str, grade_id: str) -> str:
    """The instructor's answer in the cell `grade_id`, as a student would hand it in (the
    solution markers taken out)."""
    nb = nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    return next(MARKERS.sub("", c.source) for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def answer_variant(lab: str, namespace: dict, grade_id: str, *changes: tuple[str, str]) -> dict:
    """`namespace` (a lab's checks') with the solution's answer in `grade_id`, each (old, new)
    of `changes` replaced (every occurrence), run in it as a student's cell would be."""
    source = answer_source(lab, grade_id)
    for old, new in changes:
        assert old in source, f"{grade_id} no longer contains {old!r}"
        source = source.replace(old, new)
    exec(source, namespace)  # noqa: S102 - the variant, as a student would write it
    return namespace
