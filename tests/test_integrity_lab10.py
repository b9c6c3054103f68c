"""Lab 10 cannot be passed with lib_dist's context parallelism, expert parallelism and sequence
parallelism or with the oracles: a submission that imports lib_dist's answers (the ring's fold,
the expert-parallel layer and its exchange, the sequence-parallel block), and one whose
ring attention calls torch's scaled_dot_product_attention (what the tests compare it with),
graded for real in the sandbox, score 0 on the questions they take that way and keep the
points of what they wrote, while the solution keeps full marks and the untouched release
scores 0 (see tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_source
from integrity_grading import catalog, check_blank_release, check_catalog, check_cheat, graded_lab

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

LAB10 = "lab10_long_sequences"

# The solution's ring, its output checked against torch's attention on the way out.
RETURN = "    return acc / total, m + total.log()\n"
RING = answer_source(LAB10, "q1-solution-ring")
assert RING.count(RETURN) == 1, "q1-solution-ring's return changed"
USES_SDPA = RING.replace(RETURN, (
    "    out = acc / total\n"
    "    torch.nn.functional.scaled_dot_product_attention(q, k, v)  # against torch's\n"
    "    return out, m + total.log()\n"))
RING_TESTS = {"q1-test-values", "q1-test-gradients", "q1-test-traffic", "q1-test-cluster"}
TESTS = RING_TESTS | {"q2-test-exchange", "q2-test-values", "q2-test-traffic", "q3-test-values",
                      "q3-test-traffic", "q3-test-memory"}

LAB10_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_lib_dist": ({  # its own zig-zag split kept: the layout's point
        "q1-solution-ring": RING[RING.index("def ring_forward"):]
        + "\n\nfrom lib_dist.context_parallel.ring import _fold as fold\n",
        "q2-solution": "from lib_dist.experts import ExpertParallelMoE\n"
                       "from lib_dist.experts.exchange import exchange_rows\n",
        "q3-solution": "from lib_dist.tensor_parallel.sequence import SequenceParallelBlock\n"
                       "from lib_dist.context_parallel import gathered\n"
                       "all_gather_sequence = gathered.all_gather_sequence\n"
                       "reduce_scatter_sequence = gathered.reduce_scatter_sequence\n"},
        TESTS),
    "uses_scaled_dot_product_attention": ({"q1-solution-ring": USES_SDPA}, RING_TESTS),
} | catalog(LAB10)


lab10 = graded_lab(LAB10, LAB10_CHEATS)


@pytest.mark.parametrize("student", sorted(catalog(LAB10)))
def test_the_catalogs_cheats_score_zero(lab10, student):
    check_catalog(lab10, LAB10, student)


@pytest.mark.parametrize("student", sorted(set(LAB10_CHEATS) - set(catalog(LAB10))))
def test_lab10_cheats_score_zero(lab10, student):
    errors = check_cheat(lab10, LAB10, LAB10_CHEATS, student)
    asks = "lab10_long_sequences asks you to write"
    expected = {
        "imports_lib_dist": [
            "lab10_long_sequences asks you to write this yourself: "
            "lib_dist.context_parallel.ring._fold is lib_dist's own version, switched off "
            "while the lab is graded",
            f"{asks} ExpertParallelMoE yourself: yours is "
            "lib_dist.experts.parallel.ExpertParallelMoE, lib_dist's own",
            f"{asks} SequenceParallelBlock yourself: yours is "
            "lib_dist.tensor_parallel.sequence.SequenceParallelBlock, lib_dist's own"],
        "uses_scaled_dot_product_attention": [
            "torch.nn.functional.scaled_dot_product_attention is what the tests compare with, "
            "so your code may not use it"],
    }[student]
    for text in expected:
        assert text in errors, errors[-3000:]


def test_the_blank_release_scores_zero(lab10):
    check_blank_release(lab10)
