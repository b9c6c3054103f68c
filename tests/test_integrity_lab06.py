"""Lab 6 cannot be passed with lib_dist's tensor parallelism or torch's: a submission that
imports lib_dist's answers, and one whose MLP is torch's `parallelize_module` plan, graded for
real in the sandbox, score 0 on the questions they take that way and keep the points of what
they wrote, while the solution keeps full marks and the untouched release scores 0 (see
tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_source
from integrity_grading import check_blank_release, check_cheat, code, graded_lab

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

LAB06 = "lab06_tensor_parallel"


Q3 = answer_source(LAB06, "q3-solution")  # ParallelMLP, then ParallelAttention
TORCH_MLP = code("""
    def ParallelMLP(mlp, comm):  # torch's plan does the work
        import copy

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        plan = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
        mesh = init_device_mesh("cpu", (comm.world_size,))
        return parallelize_module(copy.deepcopy(mlp), mesh, plan)
    """) + "\n\n"

LAB06_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_lib_dist": ({
        "q1-solution": "from lib_dist.tensor_parallel import CopyToRanks, ReduceFromRanks\n",
        "q2-column-solution": "from lib_dist.tensor_parallel import ColumnParallelLinear\n",
        "q2-row-solution": "from lib_dist.tensor_parallel import RowParallelLinear\n",
        "q3-solution": "from lib_dist.tensor_parallel import ParallelAttention, ParallelMLP\n",
        "q4-solution": "from lib_dist.tensor_parallel import vocab_parallel_cross_entropy\n"},
        "all"),
    # the solution's ParallelAttention, kept: its points stay
    "plans_with_torch": ({"q3-solution": TORCH_MLP + Q3[Q3.index("class ParallelAttention"):]},
                         {"q3-test-mlp", "q3-test-collectives", "q5-test-cluster"}),
}


lab06 = graded_lab(LAB06, LAB06_CHEATS)


@pytest.mark.parametrize("student", sorted(LAB06_CHEATS))
def test_lab06_cheats_score_zero(lab06, student):
    errors = check_cheat(lab06, LAB06, LAB06_CHEATS, student)
    off = "is lib_dist's own version, switched off while the lab is graded"
    expected = {
        "imports_lib_dist": [
            "lab06_tensor_parallel asks you to write CopyToRanks yourself: yours is "
            "lib_dist.tensor_parallel.functions.CopyToRanks, lib_dist's own",
            "asks you to write ColumnParallelLinear yourself: yours is "
            "lib_dist.tensor_parallel.layers.ColumnParallelLinear, lib_dist's own",
            f"lib_dist.tensor_parallel.vocab_parallel_cross_entropy {off}"],
        "plans_with_torch": ["torch.distributed.tensor.parallel.ColwiseParallel is what the "
                             "tests compare with"],
    }[student]
    for text in expected:
        assert text in errors


def test_the_blank_release_scores_zero(lab06):
    check_blank_release(lab06)
