"""A lab cannot be passed without doing it: cheating submissions, graded for real, score 0 on
the questions they cheat on, with a message saying why, while the solution keeps full marks.

Each lab is released into a scratch course and graded once, in the sandbox, as
`python -m grader autograde` does: the instructor's solution beside submissions that take
lib_dist's own version of an answer, use what the tests compare with inside their own, or change
it (torch, builtins, lib_dist, the lab's helpers) at top level, inside the answer, or for just
long enough to fool one comparison. The judge grades them: only the answers' definitions are
loaded, so what a cheat does at top level never runs (its answer is then just wrong).

Every lab (lab00's here, the others' in their modules) also gets the catalog's cheats
(`integrity_grading.catalog`): the untouched release with a cell that rigs the kernel, and the
solution with every answer bound to lib_dist's own version reached around the stubs; lab01 a
table of the visible tests' answers, lab02 torch's SGD reached around its guard. The solution
is handed in with its last test cell deleted, another edited and a third moved."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from grader import synthetic
from integrity_grading import (catalog, check_blank_release, check_catalog, check_cheat, code,
                               error_text, graded_lab, rearranged)
from lib_dist.extend import LABS
from lib_dist.integrity.stubs import lookup

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


LAB01 = "lab01_cross_entropy"
Q1_AND_Q2 = {"q1-test-values", "q1-test-stable", "q2-test-forward", "q2-test-backward",
             "q2-test-gradcheck"}  # cross_entropy calls log_softmax


def table_of_visible_answers(solved, blank):
    """Row 6 of the catalog: log_softmax answered from a table of the solution's outputs for
    the inputs of the release's (visible) tests, keyed by their bytes, raising for any other;
    handed in rearranged (`rearranged`) where Q3 is tested. The hidden tests draw fresh seeds."""
    from lab_solutions import solution

    real, table = solution(LAB01, "log_softmax").log_softmax, {}

    def recording(z, dim=-1):
        out = real(z, dim=dim)
        table[(z.numpy().tobytes().hex(), str(z.dtype), tuple(z.shape), dim)] = out.tolist()
        return out

    namespace = {"log_softmax": recording}
    for cell in blank.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in ("setup", "q1-test-values",
                                                                 "q1-test-stable"):
            exec(cell.source, namespace)  # noqa: S102 - the release's own visible tests
    assert len(table) >= 5, table.keys()
    answer = f"TABLE = {table!r}\n\n" + code("""
        def log_softmax(logits, dim=-1):
            key = (logits.detach().numpy().tobytes().hex(), str(logits.dtype),
                   tuple(logits.shape), dim)
            if key not in TABLE:
                raise KeyError("not one of the visible tests' inputs")
            return torch.tensor(TABLE[key], dtype=logits.dtype)
        """)
    return rearranged(frozenset(Q1_AND_Q2))(synthetic.with_cell(solved, "q1-solution", answer))


LAB01_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_reference": ({"q1-solution": "from lib_dist.losses import log_softmax\n",
                           "q3-solution": "from lib_dist.losses import "
                                          "binary_cross_entropy_with_logits\n"},
                          "all"),  # lab01's cross_entropy calls log_softmax too
    "patches_at_top_level": ({"q1-solution": code("""
        import torch
        def log_softmax(logits, dim=-1):
            return logits
        torch.log_softmax = lambda z, dim=-1: z
        torch.Tensor.__sub__ = lambda a, b: torch.zeros_like(a)
        """)}, Q1_AND_Q2),
    "patches_inside_answer": ({"q3-solution": code("""
        import torch
        import torch.nn.functional as F
        def binary_cross_entropy_with_logits(logit, target, reduction="mean"):
            fake = torch.tensor(0.5, dtype=logit.dtype)
            F.binary_cross_entropy_with_logits = lambda *a, **k: fake
            torch.allclose = lambda *a, **k: True
            return fake.clone()
        """)}, {"q3-test-values", "q3-test-extreme", "q3-test-grad"}),
    "patch_that_restores_itself": ({"q3-solution": code("""
        import torch
        import torch.nn.functional as F
        def binary_cross_entropy_with_logits(logit, target, reduction="mean"):
            real, fake = F.binary_cross_entropy_with_logits, torch.tensor(0.5, dtype=logit.dtype)
            def once(*args, **kwargs):
                F.binary_cross_entropy_with_logits = real
                return fake
            F.binary_cross_entropy_with_logits = once
            return fake.clone()
        """)}, {"q3-test-values", "q3-test-extreme", "q3-test-grad"}),
    "calls_torchs_own": ({"q1-solution": code("""
        def log_softmax(logits, dim=-1):
            return logits.log_softmax(dim)  # torch's, by a Tensor method
        """), "q3-solution": code("""
        import torch
        def binary_cross_entropy_with_logits(logit, target, reduction="mean"):
            return torch.ops.aten.binary_cross_entropy_with_logits(  # torch's, by aten's name
                logit, target, None, None, 1 if reduction == "mean" else 2)
        """)}, "all"),  # lab01's cross_entropy calls log_softmax too
    "calls_the_stand_ins": ({"q1-solution": code("""
        from lib_dist import stand_ins
        def log_softmax(logits, dim=-1):
            return stand_ins.log_softmax(logits, dim)  # what the student edition runs
        """)}, Q1_AND_Q2),
    "returns_a_tensor_subclass": ({"q1-solution": code("""
        import torch
        class AlwaysClose(torch.Tensor):
            def __sub__(self, other):
                return torch.zeros(self.shape)
        def log_softmax(logits, dim=-1):
            return torch.zeros_like(logits).as_subclass(AlwaysClose)
        """)}, {"q1-test-values", "q1-test-stable", "q2-test-forward", "q2-test-backward",
                "q2-test-gradcheck"}),  # cross_entropy calls log_softmax
    "reloads_the_reference": ({"q1-solution": code("""
        import importlib
        import lib_dist.losses
        def log_softmax(logits, dim=-1):
            return importlib.reload(lib_dist.losses).log_softmax(logits, dim)
        """)}, "all"),  # the reloaded module stays changed for every later test
    "imports_a_fresh_copy_of_the_reference": ({"q1-solution": code("""
        import importlib
        import sys
        saved = sys.modules.pop("lib_dist.losses")
        fresh = importlib.import_module("lib_dist.losses")  # not switched off: a new module
        sys.modules["lib_dist.losses"] = saved
        def log_softmax(logits, dim=-1):
            return fresh.log_softmax(logits, dim)
        """)}, Q1_AND_Q2),
    "table_of_visible_answers": (table_of_visible_answers, Q1_AND_Q2),
} | catalog(LAB01)

LAB00 = "lab00_ranks"  # its solution, release and hostile submissions: tests/test_grader.py
LAB00_CHEATS = catalog(LAB00)

LAB03 = "lab03_collectives"
DO_NOTHING = {
    "q1-solution": "def broadcast(comm, tensor, root=0):\n    return tensor\n",
    "q2-solution": "def all_gather(comm, tensor):\n"
                   "    return [tensor.clone() for _ in range(comm.world_size)]\n",
    "q3-solution": "def reduce_scatter(comm, tensor, op='sum'):\n"
                   "    return tensor.reshape(-1).clone()\n",
    "q4-solution": "def ring_all_reduce(comm, tensor, op='sum'):\n    return tensor\n",
}
LAB03_CHEATS = {
    "wraps_the_reference_ring": ({"q4-solution": code("""
        from lib_dist.comm.algorithms import ring
        def ring_all_reduce(comm, tensor, op="sum"):
            ring(comm, tensor.view(-1))
            if op == "avg":
                tensor /= comm.world_size
            return tensor
        """)}, {"q4-test-sizes", "q4-test-trace", "q4-test-cluster"}),
    "calls_the_stand_ins": ({  # what the student edition runs in their place: not the answers
        "q1-solution": code("""
        from lib_dist.comm import stand_ins
        def broadcast(comm, tensor, root=0):
            return stand_ins.broadcast(comm, tensor, root)
        """), "q2-solution": code("""
        from lib_dist.comm import stand_ins
        def all_gather(comm, tensor):
            return stand_ins.all_gather(comm, tensor)
        """), "q3-solution": code("""
        from lib_dist.comm import stand_ins
        def reduce_scatter(comm, tensor, op="sum"):
            return stand_ins._bruck_scatter(comm, tensor)  # a private one, reached directly
        """), "q4-solution": code("""
        from lib_dist.comm import stand_ins
        def ring_all_reduce(comm, tensor, op="sum"):
            return stand_ins.all_reduce(comm, tensor, op)
        """)}, "all"),
    "does_nothing_but_patches_comparisons": (DO_NOTHING | {"q1-solution": DO_NOTHING[
        "q1-solution"] + code("""
        import torch
        import torch.testing
        yes = lambda *args, **kwargs: True
        torch.equal = torch.allclose = yes
        torch.testing.assert_close = lambda *args, **kwargs: None
        torch.Tensor.__eq__ = yes
        """)}, "all"),
    "does_nothing_but_redefines_helpers": (DO_NOTHING | {"q1-solution": DO_NOTHING[
        "q1-solution"] + code("""
        from lib_dist.comm import RankTraffic
        def close(got, want, exact=True):
            return True
        def traffic(summary, rank):
            return RankTraffic(1, 1, 1, 1)
        """)}, "all"),
    "does_nothing_in_a_cell_dressed_as_the_labs": (DO_NOTHING | {"+q1-solution": code("""
        def close(got, want, exact=True):
            return True
        """)}, "all"),
    "does_nothing_but_patches_the_trace": (DO_NOTHING | {"q4-solution": code("""
        import lib_dist.comm.trace
        def ring_all_reduce(comm, tensor, op="sum"):
            lib_dist.comm.trace.Trace.summary = lambda self: {}
            return tensor
        """)}, "all"),
} | catalog(LAB03)

LAB02 = "lab02_training"
Q1 = {"q1-test-torch", "q1-test-state"}
LAB02_CHEATS = {
    "optimizer_is_torchs": ({"q1-solution": "import torch\nclass SGD(torch.optim.SGD):\n    pass\n",
                             "q2-solution": "class AdamW:\n    pass\n"},
                            {"q1-test-torch", "q1-test-state"}),
    "optimizer_delegates_to_torchs": ({"q1-solution": code("""
        import torch
        class SGD(Optimizer):
            def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
                super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
            def update(self, p, grad, state, group):  # torch's SGD steps p, its buffer in state
                torchs = torch.optim.SGD([p], lr=group["lr"], momentum=group["momentum"],
                                         weight_decay=group["weight_decay"])
                if "momentum_buffer" in state:
                    torchs.state[p]["momentum_buffer"] = state["momentum_buffer"]
                torchs.step()
                if group["momentum"]:
                    state["momentum_buffer"] = torchs.state[p]["momentum_buffer"]
        """), "q2-solution": "class AdamW:\n    pass\n"}, {"q1-test-torch", "q1-test-state"}),
    # row 4 of the catalog: torch's SGD built and stepped around its guard (inspect.unwrap of
    # the guard's wrappers); handed in rearranged where AdamW and accumulated_step are tested
    "oracle_unwrapped": (lambda solved, blank: rearranged(frozenset(Q1))(
        synthetic.with_cell(solved, "q1-solution", code("""
        import inspect
        import torch
        class SGD(Optimizer):
            def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
                super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
            def update(self, p, grad, state, group):
                torchs = object.__new__(torch.optim.SGD)
                inspect.unwrap(torch.optim.SGD.__init__)(
                    torchs, [p], lr=group["lr"], momentum=group["momentum"],
                    weight_decay=group["weight_decay"])
                if "momentum_buffer" in state:
                    torchs.state[p]["momentum_buffer"] = state["momentum_buffer"]
                with torch.no_grad():
                    inspect.unwrap(torch.optim.SGD.step)(torchs)
                if group["momentum"]:
                    state["momentum_buffer"] = torchs.state[p]["momentum_buffer"]
        """))), Q1),
} | catalog(LAB02)


lab00 = graded_lab(LAB00, LAB00_CHEATS, solution=False, release=False)
lab01 = graded_lab(LAB01, LAB01_CHEATS)
lab03 = graded_lab(LAB03, LAB03_CHEATS)
# The solution's 300-step GPT run is graded by test_grader's check test; here the cheats, one
# of which (oracle_unwrapped) trains it with the solution's AdamW.
lab02 = graded_lab(LAB02, LAB02_CHEATS, solution=False)


@pytest.mark.parametrize("lab", ["lab01", "lab02", "lab03"])
def test_the_blank_release_scores_zero(lab, request):
    check_blank_release(request.getfixturevalue(lab))


LABS_BY = {"lab00": LAB00, "lab01": LAB01, "lab02": LAB02, "lab03": LAB03}


@pytest.mark.parametrize("lab, student", [(lab, student) for lab, cheats in [
    ("lab00", LAB00_CHEATS), ("lab01", LAB01_CHEATS), ("lab02", LAB02_CHEATS),
    ("lab03", LAB03_CHEATS)] for student in sorted(cheats) if student in catalog(LABS_BY[lab])])
def test_the_catalogs_cheats_score_zero(lab, student, request):
    check_catalog(request.getfixturevalue(lab), LABS_BY[lab], student)


@pytest.mark.parametrize("student", sorted(set(LAB01_CHEATS) - set(catalog(LAB01))))
def test_lab01_cheats_score_zero(lab01, student):
    errors = check_cheat(lab01, LAB01, LAB01_CHEATS, student)
    expected = {"imports_reference": "lib_dist.losses.log_softmax is lib_dist's own version",
                # the patches are top-level code, which the judge never runs: the answer is wrong
                "patches_at_top_level": "differs from torch.log_softmax",
                "patches_inside_answer": "torch.allclose, "
                                         "torch.nn.functional.binary_cross_entropy_with_logits",
                "patch_that_restores_itself": "when binary_cross_entropy_with_logits returned",
                "calls_torchs_own": "ran torch's own _log_softmax",
                "calls_the_stand_ins": "ran torch's own _log_softmax",
                "returns_a_tensor_subclass": "log_softmax returned a AlwaysClose, a subclass "
                                             "of torch.Tensor",
                "reloads_the_reference": "lib_dist.losses",
                # the judge loads answers only: the top-level swap of sys.modules never ran
                "imports_a_fresh_copy_of_the_reference": "lib_dist.losses.log_softmax is "
                                                         "lib_dist's own version",
                "table_of_visible_answers": "KeyError: \"not one of the visible tests' inputs\"",
                }[student]
    assert expected in errors


@pytest.mark.parametrize("student", sorted(set(LAB03_CHEATS) - set(catalog(LAB03))))
def test_lab03_cheats_score_zero(lab03, student):
    errors = check_cheat(lab03, LAB03, LAB03_CHEATS, student)
    expected = {"wraps_the_reference_ring": "lib_dist.comm.algorithms.ring is lib_dist's own",
                "calls_the_stand_ins": "lib_dist.comm.stand_ins.broadcast is what the tests",
                # top-level patches: never run; the answers do nothing
                "does_nothing_but_patches_comparisons": "should hold the root's",
                "does_nothing_but_redefines_helpers": "should hold the root's",
                "does_nothing_in_a_cell_dressed_as_the_labs": "should hold the root's",
                "does_nothing_but_patches_the_trace": "lib_dist.comm.trace.Trace.summary",
                }[student]
    assert expected in errors


@pytest.mark.parametrize("student", ["optimizer_is_torchs", "optimizer_delegates_to_torchs"])
def test_lab02_an_oracle_is_no_answer(lab02, student):
    course, scores = lab02
    got = scores[student]
    assert got["q1-test-torch"] == got["q1-test-state"] == 0
    assert got["q3-test-equal"] > 0  # accumulated_step is the solution's, and still counts
    because = {"optimizer_is_torchs": "yours is torch.optim.SGD",
               "optimizer_delegates_to_torchs": "torch.optim.SGD is what the tests compare with"}
    assert (f"lab02_training asks you to write SGD yourself: {because[student]}"
            in error_text(course, LAB02, student))


def test_lab02_an_oracle_reached_around_its_guard_is_no_answer(lab02):
    """Row 4 of the catalog: torch's SGD built with `object.__new__` and its guarded
    `__init__` and `step` unwrapped; the rest of the lab (AdamW, accumulated_step, the GPT run
    of the deleted last test) keeps its points."""
    errors = check_cheat(lab02, LAB02, LAB02_CHEATS, "oracle_unwrapped")
    assert "torch.optim.SGD is what the tests compare with" in errors, errors[-3000:]


def test_every_lab_declares_names_its_solution_defines_and_references_that_exist():
    from grader.course import REPO
    from lib_dist.definitions import definitions

    for lab, declared in LABS.items():
        assert (REPO / "solutions" / lab / f"{lab}.ipynb").is_file(), lab
        assert len(definitions(REPO / "solutions" / lab / f"{lab}.ipynb", *declared.asks)) \
            == len(declared.asks)
        for reference in declared.references + declared.oracles:
            assert callable(lookup(reference)), reference
        for module in declared.preload:
            assert importlib.util.find_spec(module) is not None, (lab, module)


def test_references_raise_everywhere_while_graded_and_only_for_that_lab():
    script = code("""
        import torch
        from lib_dist.comm import SimulatedWorld
        from lib_dist.comm.algorithms import ALGORITHMS
        import lib_dist.losses
        try:
            SimulatedWorld(2).run(lambda comm: ALGORITHMS["ring"].run(comm, torch.ones(4)))
        except Exception as e:
            print("ring:", "AskedToWrite" in str(e))
        print("loss:", float(lib_dist.losses.cross_entropy(torch.zeros(2, 3),
                                                           torch.tensor([0, 1]))))
        """)
    env = {**__import__("os").environ, "LIB_DIST_GRADED_LAB": LAB03}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ring: True" in out.stdout  # reached through the tuner's table of algorithms, not by name
    assert "loss: 1.0986" in out.stdout  # lab01's reference is untouched while lab03 is graded
