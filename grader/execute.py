"""Running a submission: one student's bug costs that student a cell, never the whole grade.

nbgrader 0.9 executes a submission with nbclient and, if the kernel dies (a student's
`os._exit`, a segfault, the memory limit), throws the whole submission away. `GradedExecute`
instead records why the cell failed, marks the cells after it as not run (each worth zero),
and lets nbgrader score everything that did run. A cell that times out and whose kernel will
not come back after the interrupt is treated the same way.

nbgrader also scores any stderr output in a test cell as a failure; torch's warnings and
`%%px` echoing an engine's stderr would zero passing tests. `TestStderrIsNotAFailure` turns a
test cell's stderr into ordinary output: a failing test still fails by raising.

On a busy machine a cell gets more time than the cell timeout (`lib_dist.patience`:
stretched by the load, at most five times): a slow cell is not an endless one.

A lab that lib_dist declares (`lib_dist.extend.LABS`) is not run in a kernel at all: the judge
grades it (`grader.judged`), in a process into which only the student's answers are loaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Unicode

from lib_dist.extend import LABS
from lib_dist.patience import load_seen, stretched

from .edition import judged_edition
from .joining import SandboxLauncher
from .judged import judge_notebook
from .sandbox import SandboxedKernelManager, StandbyKernelManager, with_engines_started

RECOVERY_SECONDS = 10


def error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


class GradedExecute(Execute):
    """nbgrader's Execute, surviving a dead or stuck kernel (see the module docstring)."""

    sandbox = Bool(False, help="run each kernel in grader.sandbox").tag(config=True)
    release = Unicode("", help="the course's labs/ folder: the judge runs locked cells in "
                               "the released notebook's order").tag(config=True)
    editions = Unicode("", help="where the judged editions of lib_dist are built "
                                "(grader.edition)").tag(config=True)
    own_answers = Bool(False, help="run lib_dist on the student's own submitted answers of the "
                                   "earlier labs a lab uses (Lab.uses), not on its reference "
                                   "(autograde --own-answers)").tag(config=True)
    judged = Bool(True, help="grade the labs lib_dist declares with the judge; False runs the "
                             "notebook in a kernel, as before the judge existed (for "
                             "benchmarks/grading_throughput.py's comparison only: its "
                             "verdicts come from the student's own process)").tag(config=True)
    _stopped_at: int | None = None
    _stop_reason: str = ""
    _stretch: str = ""
    _where: str = ""
    _log: IO[bytes] | None = None
    _lab: str = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Every output is in by then; a graceful exit would only cost the submission ~0.8 s
        # of interpreter teardown, and whatever the kernel leaves is reaped (the sandbox's
        # namespace, or the cluster's watchdog when it runs without one).
        self.shutdown_kernel = "immediate"
        self.kernel_manager_class = (SandboxedKernelManager if self.sandbox
                                     else StandbyKernelManager)

    def preprocess(self, nb, resources=None, km=None):
        self._stopped_at, self._stop_reason = None, ""
        lab = (resources or {}).get("nbgrader", {}).get("notebook")
        self._lab = lab if lab in LABS else ""
        with _kernel_log(resources) as self._log:
            if self.judged and lab in LABS and (resources or {}).get("nbgrader", {}).get("db_url"):
                return self._judged(nb, resources, lab), resources
            return super().preprocess(nb, resources, km)

    def _judged(self, nb: NotebookNode, resources: dict, lab: str) -> NotebookNode:
        """The submission graded by the judge (`grader.judged`), in this grader's sandbox."""
        cwd = Path(resources.get("metadata", {}).get("path") or ".").resolve()
        edition = judged_edition(Path(self.editions or cwd / ".editions"), lab)
        release = Path(self.release) / lab / f"{lab}.ipynb" if self.release else None
        if not self.sandbox:
            def launch(argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
                env.pop("LIB_DIST_GRADED_LAB", None)
                path = [str(edition), *filter(None, [env.get("PYTHONPATH")])]
                return with_engines_started(argv, lab), env | {"PYTHONPATH": ":".join(path)}
            return judge_notebook(nb, resources, lab, release, cwd, launch, self.timeout,
                                  self._log, own_answers=self.own_answers)
        sandbox = SandboxedKernelManager(parent=self, edition=str(edition))
        try:
            nb = judge_notebook(
                nb, resources, lab, release, cwd,
                SandboxLauncher(sandbox, cwd, lab), self.timeout,
                self._log, lambda: "the sandbox's memory limit" if sandbox.memory_limit_hit()
                else "", own_answers=self.own_answers)
        finally:
            sandbox.release()
        for cell in nb.cells:
            if cell.cell_type == "code":
                explain_limits(cell, sandbox)
        return nb

    def create_kernel_manager(self):
        """nbclient's, knowing the lab: its engines start in standby beside the kernel."""
        km = super().create_kernel_manager()
        km.lab = self._lab
        return km

    def start_new_kernel(self, **kwargs):
        """The kernel's (and its engines') own stderr goes to instructor/logs/, not to the
        grader's terminal: what a student's code prints reaches the notebook either way.
        (nbclient's setup_kernel calls this, the synchronous twin.)"""
        if self._log is not None:
            kwargs.setdefault("stderr", self._log)
        return super().start_new_kernel(**kwargs)

    def preprocess_cell(self, cell: NotebookNode, resources, index: int):
        if cell.cell_type != "code":
            return cell, resources
        if self._stopped_at is not None:
            cell.outputs = [error_output("NotRun", f"not run: {self._stop_reason} in "
                                                   f"{self._where}")]
            return cell, resources
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except CellTimeoutError:  # the kernel went silent even after the interrupt
            cell.outputs.append(error_output("CellTimeoutError", f"this cell ran for more than "
                                                                 f"{self.timeout} s"))
        except DeadKernelError:
            if self._memory_limit_hit():
                self._stop(cell, index, "MemoryLimit", "the kernel hit the memory limit",
                           "the sandbox's memory limit was reached and its kernel was "
                           "killed; the cells after it were not run")
            else:
                self._stop(cell, index, "KernelDied", "the kernel died",
                           "the kernel died while running this cell (os._exit, a crash, or "
                           "running out of memory); the cells after it were not run")
            return cell, resources
        if self.sandbox:
            explain_limits(cell, self.km)
        if _timed_out(cell):
            cell.outputs = [o for o in cell.outputs if o.get("output_type") != "error"]
            cell.outputs.append(error_output(
                "CellTimeoutError", f"[grader] this cell ran past the {self.timeout} s cell "
                                    f"timeout and was interrupted{self._stretch}"))
        if _timed_out(cell) and not run_sync(self._kernel_recovers)():
            self._stop(cell, index, "CellTimeoutError", "the kernel stopped responding",
                       f"this cell ran for more than {self.timeout} s and the kernel did not "
                       "respond to an interrupt; the cells after it were not run")
            run_sync(self._kill_kernel)()
        return cell, resources

    def _get_timeout(self, cell: NotebookNode | None) -> int | None:
        """nbclient's timeout for `cell`, stretched by the machine's load when it is busy."""
        timeout = super()._get_timeout(cell)
        allowed = stretched(timeout) if timeout else timeout
        self._stretch = (f" (after {allowed:.0f} s: {load_seen()})"
                         if allowed and allowed > timeout else "")
        return allowed  # type: ignore[return-value]  # nbclient compares it with float seconds

    def _stop(self, cell: NotebookNode, index: int, ename: str, reason: str, text: str) -> None:
        self._stopped_at, self._stop_reason = index, reason
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        self._where = f"cell {index + 1}" + (f" ({grade_id})" if grade_id else "")
        cell.outputs.append(error_output(ename, text))
        self.nb["cells"][index] = cell

    async def _kernel_recovers(self) -> bool:
        """After an interrupt, does the kernel answer a trivial request within a few seconds?"""
        deadline = asyncio.get_running_loop().time() + stretched(RECOVERY_SECONDS)
        try:
            msg_id = self.kc.execute("pass", silent=True, store_history=False)
            while True:  # the interrupted cell's own reply may come first
                left = deadline - asyncio.get_running_loop().time()
                reply = await ensure_async(self.kc.get_shell_msg(timeout=max(left, 0.01)))
                if reply["parent_header"].get("msg_id") == msg_id:
                    return True
        except Exception:  # noqa: BLE001 - no reply in time, or no kernel: not recovered
            return False

    def _memory_limit_hit(self) -> bool:
        return self.sandbox and self.km is not None and self.km.memory_limit_hit()

    async def _kill_kernel(self) -> None:
        try:
            await ensure_async(self.km.kill_kernel())
        except Exception:  # noqa: BLE001 - already gone is fine
            pass


LIMITS = (  # what an error says -> which of the sandbox's limits it met
    (("MemoryError", "can't allocate memory", "Cannot allocate memory", "bad_alloc"),
     "memory limit", "memory_mb", "MiB per process"),
    (("Resource temporarily unavailable", "can't start new thread"),
     "process limit", "processes", "processes and threads"),
    (("File too large",), "file size limit", "file_size_mb", "MiB per file"),
)


def explain_limits(cell: NotebookNode, km) -> None:
    """After an error caused by one of the sandbox's limits, say which limit it was."""
    errors = " ".join(f"{o.get('ename', '')} {o.get('evalue', '')}" for o in cell.outputs
                      if o.get("output_type") == "error")
    for needles, name, trait, unit in LIMITS:
        if errors and any(n in errors for n in needles):
            cell.outputs.append(NotebookNode(
                output_type="stream", name="stdout",
                text=f"[grader] this cell reached the sandbox's {name} "
                     f"({getattr(km, trait)} {unit})\n"))
            return


@contextmanager
def _kernel_log(resources: dict | None) -> Iterator[IO[bytes] | None]:
    """instructor/logs/<student>-<lab>.log, beside autograded/<student>/<lab>/."""
    folder = (resources or {}).get("metadata", {}).get("path")
    meta = (resources or {}).get("nbgrader", {})
    if not folder or not meta.get("student"):
        yield None
        return
    logs = Path(folder).resolve().parents[1].parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{meta['student']}-{meta.get('notebook', 'notebook')}.log", "wb") as log:
        yield log


def _timed_out(cell: NotebookNode) -> bool:
    return any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError"
               for o in cell.get("outputs", []))


class TestStderrIsNotAFailure(NbGraderPreprocessor):
    """Show a test cell's stderr as ordinary output, so that only exceptions fail a test."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
            for output in cell.outputs:
                if output.output_type == "stream" and output.name == "stderr":
                    output.name = "stdout"
        return cell, resources
