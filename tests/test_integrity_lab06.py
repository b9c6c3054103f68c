"""Lab 6 cannot be passed with lib_dist's tensor parallelism or torch's: a submission that
imports lib_dist's answers, and one whose MLP is torch's `parallelize_module` plan, graded for
real in the sandbox, score 0 on the questions they take that way and keep the points of what
they wrote, while the solution keeps full marks and the untouched release scores 0 (see
tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import pytest

from lab_solutions import answer_source
from integrity_grading import (catalog, check_blank_release, check_catalog, check_cheat, code,
                               graded_lab)

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

TORCH_MLP_UNWRAPPED = code("""
    def ParallelMLP(mlp, comm):
        import copy
        import inspect

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        def unguarded(style):  # a subclass whose methods are the guarded ones, unwrapped
            body = {k: inspect.unwrap(v) for k, v in vars(style).items()
                    if inspect.isfunction(v)}
            made = object.__new__(type(style.__name__, (style,), body))
            inspect.unwrap(style.__init__)(made)
            return made

        plan = {"fc": unguarded(ColwiseParallel), "proj": unguarded(RowwiseParallel)}
        mesh = init_device_mesh("cpu", (comm.world_size,))
        return inspect.unwrap(parallelize_module)(copy.deepcopy(mlp), mesh, plan)
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
    # row 4 of the catalog: torch's plan around its guard (parallelize_module unwrapped, its
    # styles made with object.__new__ as subclasses whose methods are unwrapped)
    "oracle_unwrapped": ({"q3-solution": TORCH_MLP_UNWRAPPED
                          + Q3[Q3.index("class ParallelAttention"):]},
                         {"q3-test-mlp", "q3-test-collectives", "q5-test-cluster"}),
} | catalog(LAB06)


lab06 = graded_lab(LAB06, LAB06_CHEATS)


@pytest.mark.parametrize("student", sorted(catalog(LAB06)))
def test_the_catalogs_cheats_score_zero(lab06, student):
    check_catalog(lab06, LAB06, student)


@pytest.mark.parametrize("student", sorted(set(LAB06_CHEATS) - set(catalog(LAB06))))
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
        "oracle_unwrapped": ["is what the tests compare with"],
    }[student]
    for text in expected:
        assert text in errors


def test_the_blank_release_scores_zero(lab06):
    check_blank_release(lab06)
