"""A submission of a lab lib_dist declares, graded by the judge (`grader.judge`) instead of by
running the notebook: what goes in (the student's cells, the lab's locked cells from the
gradebook in the release's order) and what comes back into the notebook nbgrader scores.

Every locked code cell gets the judge's outputs: what it printed, the exception it raised, what
the guard or the seal saw change, and the grader's own reason where the judge did not finish
it. A test that did not pass ends with an error, which is what nbgrader scores as 0. A test the
submitted notebook shows passing (its own stored run) that the judge failed says so. The
student's own cells keep no outputs: they were not run, only the answers' definitions loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import nbformat
from nbformat.notebooknode import NotebookNode
from nbgrader.api import Gradebook

from lib_dist.extend import LABS
from lib_dist.registry import lab_of

from .judge import Cell, Judgement, Launcher, Result, judge

DISAGREES = ("[grader] the notebook you handed in shows this test passing; the graded run, in "
             "which only your answers were loaded, did not pass it (see above)")


def judge_notebook(nb: NotebookNode, resources: dict[str, Any], lab: str, release: Path | None,
                   cwd: Path, launch: Launcher, timeout: float, log: IO[bytes] | None,
                   died_why: Any = lambda: "", own_answers: bool = False) -> NotebookNode:
    """Grade `nb` with the judge and put its results into the locked cells (module docstring).
    `own_answers`: lib_dist runs on the student's own answers of the earlier labs this lab
    uses (`earlier_answers`), not on its reference."""
    sources = gradebook_cells(resources)
    cells = [Cell(name, *sources[name]) for name in release_order(release, nb, sources)]
    # where the answers come from: every code cell in the notebook's order, the locked ones
    # as the gradebook holds them (their imports and constants are what the answers build on)
    answers = [sources[_name(c)][0] if _name(c) in sources else c.source
               for c in nb.cells if c.cell_type == "code"]
    earlier = earlier_answers(lab, _submitted(resources)) if own_answers else {}
    found = judge(lab, answers, cells, cwd, launch, timeout, log, died_why, earlier)
    stored = stored_passes(_submitted(resources))
    by_name = {cell.name: (cell, found.results[i]) for i, cell in enumerate(cells)}
    for nb_cell in nb.cells:
        if nb_cell.cell_type == "code" and _name(nb_cell) in by_name:
            cell, result = by_name[_name(nb_cell)]
            nb_cell.outputs = outputs_of(cell, result, _name(nb_cell) in stored)
            nb_cell.execution_count = None
    not_submitted = [f"{name} ({lab_of(name)})" for name in LABS[lab].uses
                     if own_answers and lab_of(name) not in earlier]
    _say_what_was_loaded(nb, found, set(sources), not_submitted)
    return nb


def earlier_answers(lab: str, submitted: Path | None) -> dict[str, dict[str, list[str]]]:
    """What `autograde --own-answers` hands the judge: for each earlier lab whose answers
    `lab` uses (`Lab.uses`), the names to take and the code cells of the student's notebook of
    it in the course's submitted/ folder (`submitted` is this submission's notebook there).
    A lab the student did not submit is left out: lib_dist's reference is used for it."""
    wanted: dict[str, list[str]] = {}
    for name in LABS[lab].uses:
        wanted.setdefault(lab_of(name), []).append(name)
    found: dict[str, dict[str, list[str]]] = {}
    for earlier, names in wanted.items():
        path = (submitted.parents[1] / earlier / f"{earlier}.ipynb"
                if submitted is not None else None)
        if path is None or not path.is_file():
            continue
        try:
            notebook = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - the student's file: as if not submitted
            continue
        found[earlier] = {"names": names, "cells": [c.source for c in notebook.cells
                                                    if c.cell_type == "code"]}
    return found


def gradebook_cells(resources: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """grade id -> (source, graded) of the lab's locked code cells, hidden tests included."""
    meta = resources["nbgrader"]
    with Gradebook(meta["db_url"]) as gb:
        notebook = gb.find_notebook(meta["notebook"], meta["assignment"])
        graded = {c.name for c in notebook.grade_cells}
        return {c.name: (c.source, c.name in graded) for c in notebook.source_cells
                if c.locked and c.cell_type == "code"}


def release_order(release: Path | None, nb: NotebookNode,
                  sources: dict[str, tuple[str, bool]]) -> list[str]:
    """The locked cells' names in the release's order (the submission's own order, where the
    released notebook is not at hand); every one of them, whatever the submission deleted."""
    shipped = nbformat.read(release, as_version=4) if release and release.is_file() else nb
    order = [n for n in (_name(c) for c in shipped.cells) if n in sources]
    return list(dict.fromkeys(order + sorted(set(sources) - set(order))))


def outputs_of(cell: Cell, result: Result, stored_pass: bool) -> list[NotebookNode]:
    outputs = []
    if result.text:
        outputs.append(_stream(result.text))
    if result.error:
        outputs.append(_error(result.error["ename"], result.error["evalue"],
                              result.error.get("traceback")))
    if result.changed:
        shown = ", ".join(result.changed[:6]) + (" ..." if len(result.changed) > 6 else "")
        outputs.append(_error("Tampering", f"[grader] while this cell ran, the submission "
                                           f"changed what the tests rely on ({shown}); tests "
                                           f"compare against torch, Python's builtins, lib_dist "
                                           f"and the lab's own helpers, so this cell scores 0"))
    if result.note:
        outputs.append(_error("Judge", f"[grader] {result.note}"))
    if cell.graded and not result.passed:
        if not any(o.output_type == "error" for o in outputs):
            outputs.append(_error("Judge", "[grader] the judge did not confirm that this test "
                                           "passed, so it scores 0"))
        if stored_pass:
            outputs.append(_stream(DISAGREES + "\n"))
    return outputs


def stored_passes(path: Path | None) -> set[str]:
    """Grade ids of the test cells the submitted notebook's own stored outputs show passing
    (outputs, none of them an error)."""
    if path is None or not path.is_file():
        return set()
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 - the submission's file is the student's
        return set()
    return {_name(c) for c in nb.cells if c.cell_type == "code" and c.get("outputs")
            and not any(o.get("output_type") == "error" for o in c.outputs)}


def _say_what_was_loaded(nb: NotebookNode, found: Judgement, locked: set[str],
                         not_submitted: Sequence[str] = ()) -> None:
    """One line, on the first locked cell, about the answers the judge loaded."""
    first = next((c for c in nb.cells if c.cell_type == "code" and _name(c) in locked), None)
    if first is None:
        return
    text = ("[grader] graded by the judge: your notebook was not run; the lab's tests ran "
            "against the definitions of " + (", ".join(found.loaded) or "none of its answers"))
    for name, problem in found.problems.items():
        text += f"\n[grader] {name} could not be loaded: {problem}"
    if found.earlier:
        text += ("\n[grader] graded on your own answers of earlier labs: "
                 + ", ".join(found.earlier))
    if not_submitted:
        text += ("\n[grader] not submitted, so lib_dist's reference is used: "
                 + ", ".join(not_submitted))
    first.outputs.insert(0, _stream(text + "\n"))


def _submitted(resources: dict[str, Any]) -> Path | None:
    """The notebook as handed in: instructor/submitted/<student>/<lab>/<notebook>.ipynb."""
    folder = resources.get("metadata", {}).get("path")
    meta = resources.get("nbgrader", {})
    if not folder or not meta.get("student"):
        return None
    work = Path(folder).resolve().parents[1].parent
    return work / "submitted" / meta["student"] / meta["assignment"] / f"{meta['notebook']}.ipynb"


def _name(cell: NotebookNode) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def _stream(text: str) -> NotebookNode:
    return NotebookNode(output_type="stream", name="stdout", text=text)


def _error(ename: str, evalue: str, traceback: list[str] | None = None) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=traceback or [f"{ename}: {evalue}"])
