"""The judge's process, outside nbgrader: what it loads, how its verdicts travel, what it
refuses (grader/judge.py, lib_dist/integrity/judge.py, lockdown.py, seal.py, grader/edition.py).

The judges here run without the sandbox (the graded tests, tests/test_judge.py and the
integrity modules, run them in it), on small cells of lab01, whose answers are functions."""

from __future__ import annotations

import ast
import marshal
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader.edition import SOURCE, judged_edition, student_edition
from lib_dist.stand_ins import KEPT
from grader.judge import Cell, judge
from lib_dist.extend import LABS
from lib_dist.integrity.stubs import resolve

slow = pytest.mark.slow  # each judge imports torch in a fresh process: seconds apiece
LAB = "lab01_cross_entropy"
SETUP = Cell("setup", "import torch\n", False)
ANSWER = textwrap.dedent("""
    import torch
    def log_softmax(logits, dim=-1):
        return logits - logits.logsumexp(dim, keepdim=True)
    """)
TEST = Cell("q1-test", textwrap.dedent("""
    z = torch.randn(3, 5, dtype=torch.float64)
    assert torch.allclose(log_softmax(z), torch.log_softmax(z, -1))
    print("checked")
    """), True)


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    return judged_edition(tmp_path_factory.mktemp("editions"), LAB)


def run(edition, answers, cells, timeout=60.0, tmp_path=None):
    def launch(argv, env):
        env.pop("LIB_DIST_GRADED_LAB", None)
        return argv, env | {"PYTHONPATH": str(edition)}
    return judge(LAB, [answers], cells, Path(tmp_path or "."), launch, timeout)


REACHING = {
    "frames": "import sys\nfor depth in range(64):\n    sys._getframe(depth).f_locals\n",
    "gc": "import gc\ngc.get_objects()\n",
    "ctypes": "import ctypes\nctypes.string_at(id(1), 8)\n",
    "code": "import torch\ntorch.testing.assert_close.__code__ = (lambda *a, **k: None).__code__\n",
    "defaults": "import torch.testing\n"
                "torch.testing.assert_close.__kwdefaults__ = {'rtol': 1.0, 'atol': 1.0}\n",
    "trace": "import sys\nsys.settrace(lambda *a: None)\n",
    "mem": "open('/proc/self/mem', 'rb')\n",
}
# One answer for every case below: `log_softmax(z, how)` does the right thing, raises, tries one
# of the routes into the judge, or rebinds torch.allclose; its module replaced every exception
# hook when it was loaded.
HOSTILE = textwrap.dedent("""
    import sys, threading
    import torch
    def swallow(*args, **kwargs):
        return None
    HOOKS = [setattr(sys, "excepthook", swallow), setattr(threading, "excepthook", swallow),
             setattr(sys, "unraisablehook", swallow), setattr(sys, "displayhook", swallow)]
    def log_softmax(logits, dim=-1, how="right"):
        HOOKS.append(how)
        if how == "raise":
            raise RuntimeError("wrong on purpose")
        if how == "rebind":
            torch.allclose = lambda *a, **k: True
        elif how in ROUTES:
            exec(ROUTES[how], {})
        return logits - logits.logsumexp(dim, keepdim=True)
    """) + f"ROUTES = {REACHING!r}\n"


def calling(how: str) -> Cell:
    return Cell(f"q-{how}", f"z = torch.randn(3, 5, dtype=torch.float64)\n"
                            f"assert torch.allclose(log_softmax(z, how={how!r}), "
                            f"torch.log_softmax(z, -1))\nprint('checked')\n", True)


STDLIB = Cell("q-stdlib", textwrap.dedent("""
    import collections, logging, typing, enum
    Point = collections.namedtuple("Point", "x y")
    class Pair(typing.NamedTuple):
        a: int
    Colour = enum.Enum("Colour", "RED GREEN")
    logging.getLogger("judge-test").warning("a warning from a test")
    assert Point(1, 2).x == 1 and Pair(3).a == 3 and Colour.RED.value == 1
    """), True)
CASES = ["right", "raise", *sorted(REACHING), "right", "rebind", "right"]


@pytest.fixture(scope="module")
def hostile(edition, tmp_path_factory):
    """One judge: the hostile answer's every case, each in a test cell of its own."""
    cells = [SETUP, STDLIB, *(calling(how) for how in CASES)]
    return cells, run(edition, HOSTILE, cells, tmp_path=tmp_path_factory.mktemp("hostile"))


def results_of(hostile, how):
    cells, found = hostile
    return [found.results[i] for i, cell in enumerate(cells) if cell.name == f"q-{how}"]


@slow
def test_a_right_answer_passes_and_what_the_cell_printed_comes_back(hostile):
    assert hostile[1].loaded == ["log_softmax"]
    first, after_the_routes, after_the_rebinding = results_of(hostile, "right")
    assert first.passed and after_the_routes.passed, (first, after_the_routes)
    assert "checked" in first.text
    assert not after_the_rebinding.passed  # torch.allclose stays rebound: every later test fails


@slow
def test_an_answer_that_raises_fails_even_with_every_exception_hook_replaced(hostile):
    (result,) = results_of(hostile, "raise")
    assert not result.passed and result.error["ename"] == "RuntimeError", result


@slow
@pytest.mark.parametrize("route", sorted(REACHING))
def test_an_answer_cannot_reach_into_the_judge(hostile, route):
    (result,) = results_of(hostile, route)
    assert not result.passed
    assert result.error and "the judge does not allow" in result.error["evalue"], result


@slow
def test_what_the_standard_library_asks_of_frames_still_works(hostile):
    assert hostile[1].results[1].passed, hostile[1].results[1]


@slow
def test_a_rebinding_inside_an_answer_fails_the_test_and_says_what(hostile):
    (result,) = results_of(hostile, "rebind")
    assert not result.passed and result.error["ename"] == "Tampering", result
    assert "torch.allclose" in result.error["evalue"]


@slow
def test_a_forged_verdict_fails_the_cell_it_was_written_in(edition, tmp_path):
    forger = textwrap.dedent("""
        import os
        def log_softmax(logits, dim=-1):
            for fd in range(3, 64):
                for line in (f"V 0|1|q1-test|pass|{'0' * 64}\\n", "E \\n"):
                    try:
                        os.write(fd, line.encode())
                    except OSError:
                        pass
            return logits
        """)
    found = run(edition, forger, [SETUP, TEST], tmp_path=tmp_path)
    assert not found.results[1].passed
    assert "not the judge's" in found.results[1].note


@slow
def test_a_judge_that_dies_fails_that_cell_and_a_new_one_runs_the_next(edition, tmp_path):
    dies = Cell("q1-dies", "import os\nos._exit(3)\n", True)
    found = run(edition, ANSWER, [SETUP, dies, TEST], tmp_path=tmp_path)
    assert "exited with status 3" in found.results[1].note
    assert found.results[2].passed, found.results[2]


@slow
def test_a_cell_past_its_timeout_fails_and_the_next_runs(edition, tmp_path):
    endless = Cell("q1-endless", "while True:\n    pass\n", True)
    found = run(edition, ANSWER, [SETUP, endless, TEST], timeout=3.0, tmp_path=tmp_path)
    assert "cell timeout" in found.results[1].note
    assert found.results[2].passed, found.results[2]


@pytest.mark.parametrize("lab", sorted(LABS))
def test_the_judged_edition_holds_no_body_of_the_labs_references(tmp_path, lab):
    """Neither the source nor the bytecode of any reference's body is anywhere in the edition:
    its normalised AST is in no .py, its code object's bytecode in no file at all."""
    assert_no_reference_body(judged_edition(tmp_path, lab), [lab])


def test_the_student_edition_holds_no_body_of_any_labs_references(tmp_path):
    """What `release` builds for students: every lab's references at once, none of them there;
    each stub names the first lab that asks for it; no lab is guarded on import; where every
    lab calls a reference (lab01's losses, lab03's collectives), a stand-in runs instead."""
    home = student_edition(tmp_path / "student_edition")
    assert_no_reference_body(home, sorted(LABS), kept=KEPT)
    assert student_edition(home) == home and (home / "SOURCE_HASH").is_file()  # built once
    child = subprocess.run(
        [sys.executable, "-c", "import torch, lib_dist, lib_dist.losses as l\n"
                               "from lib_dist.integrity import edition\n"
                               "print('LAB', edition.LAB)\n"
                               "print(f'{float(l.log_softmax(torch.zeros(2))[0]):.6f}')\n"
                               "from lib_dist.pipeline import balanced_bounds\n"
                               "balanced_bounds([1.0, 2.0], 2)"],
        env={k: v for k, v in os.environ.items() if k != "LIB_DIST_GRADED_LAB"}
        | {"PYTHONPATH": str(home)}, capture_output=True, text=True, timeout=120, cwd=home)
    assert child.stdout.splitlines()[:2] == ["LAB None", f"{-math.log(2):.6f}"], child.stderr
    assert child.returncode != 0
    assert "lab05_pipeline asks you to write this yourself" in child.stderr


def assert_no_reference_body(home: Path, labs: list[str], kept: tuple[str, ...] = ()) -> None:
    """`kept`: references the edition keeps on purpose (the student edition's
    torch.distributed calls, `lib_dist.stand_ins.KEPT`), left unchecked."""
    texts = [_dumps(p.read_text()) for p in home.rglob("*.py")]
    originals = [_dumps(p.read_text()) for p in SOURCE.rglob("*.py")]
    blobs = [p.read_bytes() for p in home.rglob("*") if p.is_file()]
    for lab in labs:
        checked = 0
        for reference in set(LABS[lab].references) - set(kept):
            function = resolve(reference)
            while not function.__code__.co_filename.endswith(".py") or "/torch/" in \
                    function.__code__.co_filename:
                function = function.__wrapped__
            code = function.__code__.co_code
            if len(code) < 48:  # `return self.n`: bytecode that any class may hold; no fingerprint
                continue
            checked += 1
            body = _body_dump(function)
            # a body lib_dist holds elsewhere too (a GPT block's residual sum) is no secret: the
            # edition must have one copy fewer, the reference's
            here, before = (sum(t.count(body) for t in texts), sum(t.count(body) for t in originals))
            assert here < before, (reference, here, before)
            assert before > 1 or not any(code in blob for blob in blobs), reference
            marshalled = marshal.dumps(function.__code__)
            assert not any(marshalled in blob for blob in blobs), reference
        assert checked >= (len(LABS[lab].references) - len(kept)) // 2, lab


def _body_dump(function) -> str:
    import inspect

    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    node = tree.body[0]
    return "\n".join(ast.dump(s) for s in node.body if not _docstring(s))


def _docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(getattr(stmt, "value", None), ast.Constant)


def _dumps(text: str) -> str:
    try:
        return "\n".join(ast.dump(node) for node in ast.walk(ast.parse(text))
                         if isinstance(node, ast.stmt))
    except SyntaxError:
        return ""


@slow
def test_a_child_python_in_the_edition_finds_only_the_stub(edition):
    child = subprocess.run(
        [sys.executable, "-c", "import torch, lib_dist.losses as l\n"
                               "l.log_softmax(torch.zeros(2))"],
        env={k: v for k, v in os.environ.items() if k != "LIB_DIST_GRADED_LAB"}
        | {"PYTHONPATH": str(edition)}, capture_output=True, text=True, timeout=120,
        cwd=edition)  # not the repository's root, whose lib_dist would come first
    assert child.returncode != 0 and "asks you to write this yourself" in child.stderr
