"""A lab cannot be passed without doing it: cheating submissions, graded for real, score 0 on
the questions they cheat on, with a message saying why, while the solution keeps full marks.

Each lab is released into a scratch course and graded once, in the sandbox, as
`python -m grader autograde` does: the instructor's solution beside submissions that take
lib_dist's own version of an answer, use what the tests compare with inside their own, or change
it (torch, builtins, lib_dist, the lab's helpers) at top level, inside the answer, or for just
long enough to fool one comparison."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from integrity_grading import (check_blank_release, check_cheat, code, error_text,
                               graded_lab)
from lib_dist.extend import LABS
from lib_dist.integrity.stubs import lookup

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


LAB01 = "lab01_cross_entropy"
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
        """)}, "all"),
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
        """)}, "all"),  # the fresh copy could serve any later answer
}

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
}

LAB02 = "lab02_training"
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
}


lab01 = graded_lab(LAB01, LAB01_CHEATS)
lab03 = graded_lab(LAB03, LAB03_CHEATS)
# The solution's 300-step GPT run is graded by test_grader's check test: here, the cheat.
lab02 = graded_lab(LAB02, LAB02_CHEATS, solution=False)


@pytest.mark.parametrize("lab", ["lab01", "lab02", "lab03"])
def test_the_blank_release_scores_zero(lab, request):
    check_blank_release(request.getfixturevalue(lab))


@pytest.mark.parametrize("student", sorted(LAB01_CHEATS))
def test_lab01_cheats_score_zero(lab01, student):
    errors = check_cheat(lab01, LAB01, LAB01_CHEATS, student)
    expected = {"imports_reference": "lib_dist.losses.log_softmax is lib_dist's own version",
                "patches_at_top_level": "torch.log_softmax, torch.Tensor.__sub__",
                "patches_inside_answer": "torch.allclose, "
                                         "torch.nn.functional.binary_cross_entropy_with_logits",
                "patch_that_restores_itself": "when binary_cross_entropy_with_logits returned",
                "returns_a_tensor_subclass": "log_softmax returned a AlwaysClose, a subclass "
                                             "of torch.Tensor",
                "reloads_the_reference": "lib_dist.losses",
                "imports_a_fresh_copy_of_the_reference": "a re-execution of",
                }[student]
    assert expected in errors


@pytest.mark.parametrize("student", sorted(LAB03_CHEATS))
def test_lab03_cheats_score_zero(lab03, student):
    errors = check_cheat(lab03, LAB03, LAB03_CHEATS, student)
    expected = {"wraps_the_reference_ring": "lib_dist.comm.algorithms.ring is lib_dist's own",
                "does_nothing_but_patches_comparisons": "torch.Tensor.__eq__",
                "does_nothing_but_redefines_helpers": "should hold the root's",
                "does_nothing_in_a_cell_dressed_as_the_labs": "should hold the root's",
                "does_nothing_but_patches_the_trace": "lib_dist.comm.trace.Trace.summary",
                }[student]
    assert expected in errors


@pytest.mark.parametrize("student", sorted(LAB02_CHEATS))
def test_lab02_an_oracle_is_no_answer(lab02, student):
    course, scores = lab02
    got = scores[student]
    assert got["q1-test-torch"] == got["q1-test-state"] == 0
    assert got["q3-test-equal"] > 0  # accumulated_step is the solution's, and still counts
    because = {"optimizer_is_torchs": "yours is torch.optim.SGD",
               "optimizer_delegates_to_torchs": "torch.optim.SGD is what the tests compare with"}
    assert (f"lab02_training asks you to write SGD yourself: {because[student]}"
            in error_text(course, LAB02, student))


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
