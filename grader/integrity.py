"""The grader's half of lab integrity (`lib_dist.integrity` is the kernel's half).

For a lab declared in `lib_dist.extend.LABS`, `GradedExecute`:
- starts the kernel with LIB_DIST_GRADED_LAB set, so that lib_dist's own version of each
  answer raises `AskedToWrite` in the kernel and on every engine it starts;
- arms a guard in the kernel before the first cell runs;
- sends each locked cell (setup, helpers, tests) as a call that runs it under the guard, and
  keeps the cell's source as it was in the notebook it saves;
- asks the guard, found by the address it had when armed (so that a student's object bound to
  the same name is not asked instead), what changed while each such cell ran, and fails the
  cell with a line saying so;
- clears LIB_DIST_GRADED_LAB once the kernel is done, so that nothing else inherits it.
"""

from __future__ import annotations

import ast
import os
from typing import Any

from jupyter_core.utils import ensure_async
from nbformat.notebooknode import NotebookNode
from nbgrader.api import Gradebook
from nbgrader.preprocessors import NbGraderPreprocessor

from lib_dist.patience import stretched
from lib_dist.extend import LABS
from lib_dist.integrity import GRADED_LAB

ASK_SECONDS = 60


def graded_lab(resources: dict[str, Any] | None) -> str | None:
    """The lab this notebook is, if lib_dist declares it; sets or clears LIB_DIST_GRADED_LAB
    for the kernel about to start."""
    lab = (resources or {}).get("nbgrader", {}).get("notebook")
    if lab in LABS:
        os.environ[GRADED_LAB] = lab
        return lab
    os.environ.pop(GRADED_LAB, None)
    return None


def released_cells(resources: dict[str, Any], locked_code_only: bool = False) -> set[str]:
    """The grade ids of the lab's cells as the gradebook holds them from the release (or of
    its locked code cells only): a cell a student added with such metadata is not among them."""
    meta = resources["nbgrader"]
    with Gradebook(meta["db_url"]) as gb:
        notebook = gb.find_notebook(meta["notebook"], meta["assignment"])
        return {c.name for c in notebook.source_cells
                if not locked_code_only or (c.locked and c.cell_type == "code")}


class ForgetForeignCells(NbGraderPreprocessor):
    """A cell whose nbgrader metadata names no cell of the release is the student's own: it
    loses that metadata before nbgrader restores the lab's cells (which would otherwise stop
    at it), and runs as the student's code, ungraded."""

    def preprocess(self, nb: NotebookNode, resources: dict[str, Any]):
        known = released_cells(resources)
        for cell in nb.cells:
            if "nbgrader" in cell.metadata and cell_name(cell) not in known:
                del cell.metadata["nbgrader"]
        return nb, resources


def routed(cell: NotebookNode, locked: set[str]) -> bool:
    """The lab's locked cells of plain Python run under the guard; the student's don't, nor
    cells with magics."""
    if cell.cell_type != "code" or cell_name(cell) not in locked:
        return False
    try:
        ast.parse(cell.source)
    except SyntaxError:
        return False
    return True


def guarded_source(cell: NotebookNode) -> str:
    graded = bool(cell.metadata.get("nbgrader", {}).get("grade"))
    return (f"__import__('lib_dist.integrity.guard', fromlist=['run'])"
            f".run({cell.source!r}, {cell_name(cell)!r}, {graded})")


def cell_name(cell: NotebookNode) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "cell")


async def arm(client: Any, lab: str) -> str:
    """Arm the guard in the kernel; its repr, which holds its address."""
    return str(ast.literal_eval(await ask(
        client, f"__import__('lib_dist.integrity.guard', fromlist=['arm']).arm({lab!r})")))


async def findings(client: Any, guard: str, cell: NotebookNode) -> list[str]:
    """What the guard saw change while `cell` ran. The guard is found from `object` itself
    and told by its address, with no name a submission could rebind (`__import__`, `id`):
    a stand-in that ran the cells instead would not have seen them run."""
    found = await ask(client, (
        "[g.report({cell!r}) for c in ().__class__.__base__.__subclasses__() "
        "if c.__name__ == 'Guard' for g in c.__dict__.get('armed', ()) "
        "if ().__class__.__base__.__repr__(g) == {guard!r}]"
    ).format(cell=cell_name(cell), guard=guard))
    reports = ast.literal_eval(found)
    if len(reports) != 1:
        return ["the grader's guard could not be found in the kernel"]
    return list(reports[0])


async def ask(client: Any, expression: str) -> str:
    """Evaluate `expression` in the kernel without a trace in the notebook; its repr."""
    msg_id = client.execute("", silent=True, store_history=False,
                            user_expressions={"value": expression})
    while True:
        reply = await ensure_async(client.get_shell_msg(timeout=stretched(ASK_SECONDS)))
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    value = reply["content"].get("user_expressions", {}).get("value", {})
    if value.get("status") != "ok":
        raise RuntimeError(f"the grader's guard did not answer: {value.get('ename', '')} "
                           f"{value.get('evalue', '')}".strip())
    return value["data"]["text/plain"]


def tampering_output(changes: list[str]) -> NotebookNode:
    shown = ", ".join(changes[:6]) + (f" and {len(changes) - 6} more" if len(changes) > 6 else "")
    text = (f"[grader] while this cell ran, the submission changed what the tests rely on "
            f"({shown}); tests compare against torch, Python's builtins, lib_dist and the "
            f"lab's own helpers, so this cell scores 0")
    return NotebookNode(output_type="error", ename="Tampering", evalue=text,
                        traceback=[f"Tampering: {text}"])
