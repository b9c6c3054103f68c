"""The judge (`grader.judge`, `lib_dist.integrity.judge`), driven directly: lab01's answers
loaded into it, and locked cells written for these tests, without nbgrader or a sandbox (the
judged edition comes first on the judge's PYTHONPATH, as the grader does without one).

A test passes only when the judge's signed verdict says so. What the student's answers do in
the judge's process cannot change that: an answer that raises fails its test even when its
dependencies replaced every exception hook there is; lines that look like verdicts, written to
every open file descriptor, are not verdicts; and the ways Python offers into another
function's state (frames, the garbage collector, ctypes, tracing, `/proc/self/mem`, writing a
function's `__code__`) are refused, while lib_dist's and torch's own uses of frames (a rank's
traceback, a lazy import) still work. Each such refusal fails the test it happened in, and a
test beside it that does nothing of the kind still passes, so the refusals are what failed
them. (tests/test_integrity*.py grade whole labs.)
"""

from __future__ import annotations

import math
import os
import sys

import pytest

from grader.edition import judged_edition
from grader.judge import Cell, Judgement, judge
from integrity_grading import GUARD_SWAPPER, code

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

LAB = "lab01_cross_entropy"  # no engines: the judge alone


def judged(tmp_path, answers: str, cells: list[Cell]) -> Judgement:
    """`cells` judged against the answers of lab01 defined in `answers` (one code cell)."""
    edition = judged_edition(tmp_path / "editions", LAB)

    def launch(argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        env.pop("LIB_DIST_GRADED_LAB", None)
        return argv, env | {"PYTHONPATH": os.pathsep.join(
            [str(edition), *filter(None, [env.get("PYTHONPATH")])])}

    with open(tmp_path / "judge.log", "wb") as log:
        return judge(LAB, ["import torch\n", answers], cells, tmp_path, launch, timeout=120,
                     log=log)


def outcome(found: Judgement, cells: list[Cell]) -> dict[str, bool]:
    return {cell.name: found.results[i].passed for i, cell in enumerate(cells) if cell.graded}


def said(found: Judgement, cells: list[Cell], name: str) -> str:
    result = found.results[next(i for i, c in enumerate(cells) if c.name == name)]
    return f"{result.text}\n{result.error}\n{result.note}"


HOOKS_REPLACED = code("""
    import sys
    import threading
    import traceback
    import warnings


    def _swallow(*args, **kwargs):
        return None


    def _replace_every_hook():
        sys.excepthook = sys.__excepthook__ = threading.excepthook = _swallow
        sys.unraisablehook = sys.__unraisablehook__ = sys.displayhook = _swallow
        traceback.print_exception = traceback.print_exc = traceback.format_exception = _swallow
        warnings.showwarning = _swallow
        try:
            from IPython.core.interactiveshell import InteractiveShell
            InteractiveShell.showtraceback = InteractiveShell.showsyntaxerror = _swallow
            InteractiveShell.run_cell = lambda self, *args, **kwargs: None
            shell = InteractiveShell.initialized() and InteractiveShell.instance()
            if shell:
                shell.set_custom_exc((BaseException,), _swallow)
                shell.events.register("post_run_cell", _swallow)
        except ImportError:
            pass
        return True


    HOOKED = _replace_every_hook()


    def log_softmax(logits, dim=-1):
        assert HOOKED
        raise RuntimeError("an answer that raises")


    def cross_entropy(logits, target, reduction="mean", ignore_index=-100):
        assert HOOKED
        raise SystemExit(0)  # not an Exception: still a failure


    def binary_cross_entropy_with_logits(logit, target, reduction="mean"):
        assert HOOKED
        import os
        os._exit(0)  # the judge's process ends: no verdict, however it exits
    """)


def test_an_answer_that_raises_fails_its_test_whatever_hooks_it_replaced(tmp_path):
    """The issue's named test: sys.excepthook, threading.excepthook, IPython's hooks... all
    replaced by the answers' dependencies, which run where the answers are loaded."""
    cells = [Cell("setup", "import torch\n", False),
             Cell("raises", "log_softmax(torch.zeros(3))\n", True),
             Cell("exits", "cross_entropy(torch.zeros(2, 3), torch.tensor([0, 1]))\n", True),
             Cell("dies", "binary_cross_entropy_with_logits(torch.zeros(2), torch.ones(2))\n",
                  True),
             Cell("honest", "assert torch.equal(torch.ones(2), torch.ones(2))\n", True)]
    found = judged(tmp_path, HOOKS_REPLACED, cells)
    assert found.loaded == ["binary_cross_entropy_with_logits", "cross_entropy",
                            "log_softmax"], found.problems
    assert outcome(found, cells) == {"raises": False, "exits": False, "dies": False,
                                     "honest": True}  # judged again from the cell after
    assert "the judge's process exited with status 0 while this cell ran" in said(
        found, cells, "dies")
    assert "RuntimeError" in said(found, cells, "raises")
    assert "an answer that raises" in said(found, cells, "raises")
    assert "SystemExit" in said(found, cells, "exits")


FORGER = code("""
    import os


    def log_softmax(logits, dim=-1):
        # what a verdict looks like; no key, so no signature: "pass" to every descriptor
        lines = [f"V 0123456789abcdef|{i}|{name}|pass|{'0' * 64}\\n"
                 for i, name in enumerate(["setup", "forges", "honest", "fails"])]
        lines += ["B 3\\n", "O {\\"index\\": 3, \\"text\\": \\"\\", \\"error\\": null, "
                  "\\"changed\\": []}\\n", "garbage\\n"]
        for fd in range(3, 1024):
            for line in lines:
                try:
                    os.write(fd, line.encode())
                except OSError:
                    break
        return logits
    """)


def test_lines_that_look_like_verdicts_are_not_verdicts(tmp_path):
    cells = [Cell("setup", "import torch\n", False),
             Cell("forges", "z = torch.zeros(3)\nassert log_softmax(z) is z\n", True),
             Cell("honest", "assert 2 + 2 == 4\n", True),
             Cell("fails", "raise AssertionError('a test that fails')\n", True)]
    found = judged(tmp_path, FORGER, cells)
    assert found.loaded == ["log_softmax"], found.problems
    assert outcome(found, cells) == {"forges": False, "honest": True, "fails": False}
    assert "the judge's channel carried a line that is not the judge's" in said(
        found, cells, "forges")


REACHING = code("""
    import gc
    import inspect
    import os
    import sys


    def _up(frame):
        while "expected" not in frame.f_locals:
            frame = frame.f_back
        return frame.f_locals["expected"]


    def log_softmax(how, dim=-1):
        \"\"\"Reach into the test that called: its locals hold what it compares with.\"\"\"
        if how == "getframe":
            for depth in range(1, 50):
                if "expected" in sys._getframe(depth).f_locals:
                    return sys._getframe(depth).f_locals["expected"]
        if how == "f_back":
            return _up(inspect.currentframe())
        if how == "stack":
            return next(f.frame.f_locals["expected"] for f in inspect.stack()
                        if "expected" in f.frame.f_locals)
        if how == "traceback":
            try:
                raise ValueError
            except ValueError as e:
                return _up(e.__traceback__.tb_frame)
        if how == "gc":
            return next(o for o in gc.get_objects() if isinstance(o, dict) and "expected" in o
                        and o.get("__name__") == "__main__")["expected"]
        if how == "current_frames":
            return _up(sys._current_frames()[__import__("threading").get_ident()])
        if how == "settrace":
            sys.settrace(lambda *args: None)
            return 42
        if how == "ctypes":
            import ctypes
            return ctypes.c_long.from_address(id(42)).value and 42
        if how == "mem":
            with open("/proc/self/mem", "rb"):
                return 42
        if how == "closures":  # whatever switches the hook off, found through closures
            import threading
            import traceback
            seen, todo = set(), [traceback.walk_tb]
            while todo:
                for cell in getattr(todo.pop(), "__closure__", None) or ():
                    value = cell.cell_contents
                    if isinstance(value, threading.local):
                        value.on = True
                    elif callable(value) and id(value) not in seen:
                        seen.add(id(value))
                        todo.append(value)
            return log_softmax("getframe")
        if how == "code":
            import torch.testing
            torch.testing.assert_close.__code__ = (lambda *args, **kwargs: None).__code__
            return 42
        raise ValueError(how)
    """)
WAYS = ["getframe", "gc", "current_frames", "settrace", "ctypes", "mem", "code", "closures"]
WALKS = ["f_back", "stack", "traceback"]  # up from the answer's own frame, by f_back


def reached(tmp_path, ways: list[str]) -> tuple[Judgement, list[Cell]]:
    """Each way in a test of its own whose local `expected` the answer tries to return; beside
    them, a test that does nothing of the kind."""
    cells = [Cell("setup", "import torch\n", False)]
    cells += [Cell(way, f"expected = 42\nassert log_softmax({way!r}) == expected\n", True)
              for way in ways]
    cells += [Cell("honest", "expected = 42\nassert 6 * 7 == expected\n", True)]
    return judged(tmp_path, REACHING, cells), cells


def test_the_ways_into_another_functions_state_are_refused(tmp_path):
    found, cells = reached(tmp_path, WAYS)
    assert outcome(found, cells) == dict.fromkeys(WAYS, False) | {"honest": True}
    for way in WAYS:
        assert "Forbidden: the judge does not allow" in said(found, cells, way), (
            way, said(found, cells, way))


def test_walking_up_from_the_answers_own_frame_is_refused(tmp_path):
    """f_back from the answer's own frame (inspect.currentframe, inspect.stack, a traceback)
    ends where the test's frames begin: the walk finds no `expected`."""
    found, cells = reached(tmp_path, WALKS)
    assert outcome(found, cells) == dict.fromkeys(WALKS, False) | {"honest": True}
    for way in WALKS:
        assert "expected" in said(found, cells, way) or "NoneType" in said(found, cells, way), (
            way, said(found, cells, way))


def test_the_judge_runs_with_the_edition_first(tmp_path):
    """What the other tests rely on: lib_dist's own version of the answer is not in the judge."""
    cells = [Cell("setup", "import torch\n", False),
             Cell("reference", "import lib_dist.losses\n"
                               "lib_dist.losses.log_softmax(torch.zeros(3))\n", True)]
    found = judged(tmp_path, "def log_softmax(logits, dim=-1):\n    return logits\n", cells)
    assert outcome(found, cells) == {"reference": False}
    assert ("lab01_cross_entropy asks you to write this yourself: lib_dist.losses.log_softmax"
            in said(found, cells, "reference")), said(found, cells, "reference")
    assert sys.executable  # the judge ran under this interpreter


def test_a_later_cell_importing_again_costs_no_earlier_answer():
    from lib_dist.definitions import definitions_in

    cells = ["import math\n", "TAU = 2 * math.pi\n",
             "import math\n\ndef circumference(r):\n    return TAU * r\n"]
    assert definitions_in(cells, "circumference").circumference(1) == 2 * math.pi


def test_an_answer_raising_on_a_simulated_rank_is_that_ranks_error(tmp_path):
    cells = [Cell("setup", "import torch\nfrom lib_dist.comm import SimulatedWorld\n"
                           "from lib_dist.errors import RankFailure\n", False),
             Cell("on-ranks", code("""
                 try:
                     SimulatedWorld(2).run(lambda comm: log_softmax(torch.zeros(2)))
                 except RankFailure as e:
                     assert all(isinstance(x, ValueError) for x in e.exceptions.values())
                 else:
                     raise AssertionError("no rank's error was reported")
                 """), True)]
    found = judged(tmp_path, "def log_softmax(logits, dim=-1):\n    raise ValueError('no')\n",
                   cells)
    assert outcome(found, cells) == {"on-ranks": True}, said(found, cells, "on-ranks")


def test_a_failing_comparison_raises_its_own_error(tmp_path):
    """What the lockdown refuses is the student's: torch's own failing assert_close (which
    imports torch.distributed.tensor lazily) still raises its AssertionError."""
    cells = [Cell("setup", "import torch\n", False),
             Cell("assert_close", code("""
                 import torch.testing
                 try:
                     torch.testing.assert_close(torch.ones(1), torch.zeros(1))
                 except AssertionError:
                     pass
                 """), True)]
    found = judged(tmp_path, "def log_softmax(logits, dim=-1):\n    return logits\n", cells)
    assert outcome(found, cells) == {"assert_close": True}, said(found, cells, "assert_close")


GUARD_SILENCED = GUARD_SWAPPER + code("""
    import torch

    _real_allclose = torch.allclose


    class _Quiet:
        # stands in for the guard's snapshot: finds nothing, and at the guard's own check
        # after the test, puts torch back as it was
        def __init__(self, real):
            self.real, self.asked = real, 0

        def changes(self):
            self.asked += 1
            if self.asked >= 2:
                torch.allclose = _real_allclose
            return []

        def __getattr__(self, name):
            return getattr(self.real, name)


    def log_softmax(logits, dim=-1):
        from lib_dist.integrity import current

        guard = current.guard()
        if dim == "quiet":
            guard.snapshot = _Quiet(guard.snapshot)
            torch.allclose = lambda *args, **kwargs: True
        else:
            _swap_the_guard()
        return torch.zeros(3)
    """)


def test_code_that_swaps_the_guards_parts_and_puts_them_back_passes_nothing(tmp_path):
    """The guard is an object in the answers' process: an answer can replace its state and
    methods, and what they call. The judge runs each test's code itself, and seals the moment
    it ends: a comparison swapped while the test ran, and put back by the guard's replaced
    check after it, is seen; the guard's cell runner swapped before a test, to run nothing
    and put itself back, is never called."""
    compare = "zeros = log_softmax(torch.ones(3), dim={dim!r})\n" \
              "assert torch.allclose(zeros, torch.ones(3))\n"
    cells = [Cell("setup", "import torch\n", False),
             Cell("honest", "assert torch.equal(torch.ones(2), torch.ones(2))\n", True),
             Cell("quiet", compare.format(dim="quiet"), True),
             Cell("swapper", compare.format(dim="swap"), True),
             Cell("after-swap", "assert False, 'fails whatever the answers are'\n", True)]
    found = judged(tmp_path, GUARD_SILENCED, cells)
    assert outcome(found, cells) == {"quiet": False, "swapper": False, "after-swap": False,
                                     "honest": True}, found.results
    changed = {cell.name: found.results[i].changed for i, cell in enumerate(cells)}
    assert "torch.allclose" in changed["quiet"], found.results
    assert "lib_dist.integrity.guard._exec_cell" in changed["after-swap"], found.results
    assert "fails whatever the answers are" in said(found, cells, "after-swap")  # it ran


BUILTINS_SWAPPED = code("""
    import builtins


    def _swap_the_tests_builtins():
        # while the answers load: the namespace the tests run in gets builtins of its own
        from lib_dist.integrity import current

        rigged = dict(vars(builtins), all=lambda *args: True)
        current.guard().ns["__builtins__"] = rigged
        return True


    _SWAPPED = _swap_the_tests_builtins()


    def log_softmax(logits, dim=-1):
        return _SWAPPED
    """)


def test_the_tests_namespace_swapped_while_the_answers_load_is_seen(tmp_path):
    cells = [Cell("setup", "import torch\n", False),
             Cell("uses-all", "assert all([False]), 'all of nothing true'\n", True)]
    found = judged(tmp_path, BUILTINS_SWAPPED, cells)
    assert outcome(found, cells) == {"uses-all": False}, found.results
    assert "__builtins__" in found.results[1].changed, found.results
