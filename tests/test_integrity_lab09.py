"""Lab 9 cannot be passed with lib_dist's recomputation and sharding or with the oracles: a
submission that imports lib_dist's answers (all of them, or only FSDP's prefetcher), and one
whose `checkpoint` is `torch.utils.checkpoint` (what the tests compare recomputation with),
graded for real in the sandbox, score 0 on the questions they take that way and keep the
points of what they wrote, while the solution keeps full marks and the untouched release scores
0 (see tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_source
from integrity_grading import catalog, check_blank_release, check_catalog, check_cheat, graded_lab

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

LAB09 = "lab09_fitting_the_model"

# The solution's Recompute and Checkpointed, kept; checkpoint hands the work to torch's.
APPLY = "    return Recompute.apply(fn, *inputs)\n"
Q1 = answer_source(LAB09, "q1-solution")
assert Q1.count(APPLY) == 1, "q1-solution's checkpoint changed"
USES_TORCH_CHECKPOINT = Q1.replace(APPLY, (
    "    from torch.utils.checkpoint import checkpoint as torch_checkpoint\n"
    "    return torch_checkpoint(fn, *inputs, use_reentrant=False)\n"))
Q1_TESTS = {"q1-test-gradients", "q1-test-memory", "q1-test-recompute"}
# The solution's next_unit, kept; Prefetcher is lib_dist's.
Q4 = answer_source(LAB09, "q4-solution")
NEXT_UNIT = Q4[Q4.index("def next_unit"):]

LAB09_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_lib_dist": ({
        "q1-solution": "from lib_dist.recompute import Checkpointed, Recompute, checkpoint\n",
        "q2-solution": "from lib_dist.sharding import Zero2Optimizer\n",
        "q3-solution": "from lib_dist.sharding.fsdp import FSDP, Gathered, Unit\n"
                       "from lib_dist.sharding.fsdp import _shard as shard_module\n"},
        "all"),
    "imports_the_prefetcher": ({
        "q4-solution": "from lib_dist.sharding.prefetch import Prefetcher\n" + NEXT_UNIT},
        {"q4-test-values", "q4-test-order"}),
    "uses_torch_checkpoint": ({"q1-solution": USES_TORCH_CHECKPOINT}, Q1_TESTS),
} | catalog(LAB09)


lab09 = graded_lab(LAB09, LAB09_CHEATS)


@pytest.mark.parametrize("student", sorted(catalog(LAB09)))
def test_the_catalogs_cheats_score_zero(lab09, student):
    check_catalog(lab09, LAB09, student)


@pytest.mark.parametrize("student", sorted(set(LAB09_CHEATS) - set(catalog(LAB09))))
def test_lab09_cheats_score_zero(lab09, student):
    errors = check_cheat(lab09, LAB09, LAB09_CHEATS, student)
    asks = "lab09_fitting_the_model asks you to write"
    expected = {
        "imports_lib_dist": [
            f"{asks} Checkpointed yourself: yours is lib_dist.recompute.Checkpointed, "
            "lib_dist's own",
            f"{asks} Zero2Optimizer yourself: yours is lib_dist.sharding.zero2.Zero2Optimizer, "
            "lib_dist's own",
            f"{asks} FSDP yourself: yours is lib_dist.sharding.fsdp.FSDP, lib_dist's own"],
        # FSDP's own code builds the Prefetcher: lib_dist's methods refuse when it calls them
        "imports_the_prefetcher": [f"{asks} this yourself: lib_dist.sharding.prefetch."
                                   "Prefetcher.clear is lib_dist's own version"],
        "uses_torch_checkpoint": ["torch.utils.checkpoint.checkpoint is what the tests compare "
                                  "with, so your code may not use it"],
    }[student]
    for text in expected:
        assert text in errors, errors[-3000:]


def test_the_blank_release_scores_zero(lab09):
    check_blank_release(lab09)
