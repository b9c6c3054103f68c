"""Lab 6's tests catch what they promise, and each typical mistake costs the points of what it
gets wrong and no others: the row-parallel bias added before the all-reduce (counted tp times)
fails the row layer and the blocks built on it (the collectives' point too, which takes
correct values first), while its collectives are still one all-reduce each way; f without
its backward all-reduce fails the values; g reducing its input in place fails the count test's
"input untouched"; a column layer that keeps every row fails the shapes; attention that splits
the fused query/key/value weight without regrouping it by heads is right on one rank only; a
loss that gathers the logits keeps the values and fails the traffic; a maximum not shared
between the ranks fails the values.

They run the lab's own checks, loaded from solutions/ with `definitions`, on the instructor's
solution and on variants of it (`grader check` runs the whole notebook, its 4 engines too)."""

from __future__ import annotations

import inspect

import pytest
import torch

from lab_solutions import solution

from grader.demo import TYPICAL_BUGS

pytestmark = pytest.mark.timeout(300)

LAB = "lab06_tensor_parallel"
CHECKS = ("check_operator", "check_linear", "check_uneven", "check_branch", "check_head_count",
          "check_collectives", "check_loss", "check_traffic", "CopyToRanks", "ReduceFromRanks",
          "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelAttention",
          "vocab_parallel_cross_entropy")


def lab_checks():
    """The lab's checks and answers, in the namespace the checks see."""
    return solution(LAB, *CHECKS).check_linear.__globals__


def test_the_solution_passes_every_check():
    ns = lab_checks()
    for op in (ns["CopyToRanks"], ns["ReduceFromRanks"]):
        ns["check_operator"](op, 3, counts=True)
    for n in (1, 2, 3):
        ns["check_linear"]("column", n, n_in=6, n_out=6, gather=n == 2)
        ns["check_linear"]("row", n, n_in=6, n_out=6)
    ns["check_uneven"]("column", 4, 6, 6)
    ns["check_uneven"]("row", 4, 6, 6)
    ns["check_head_count"](6, 4)
    ns["check_collectives"]("mlp", 3, n_embd=12)
    ns["check_collectives"]("attn", 4, n_embd=8)
    ns["check_loss"](3, N=4, V=12, ignored=(1,))
    ns["check_traffic"](4)


def test_the_bias_before_the_all_reduce_fails_the_row_layer_and_keeps_the_counts():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q2-row-solution"
    ns = lab_checks()
    exec(source, ns)  # noqa: S102 - the bug, as a student would write it
    ns["check_linear"]("row", 1)  # one rank: the bias is added once either way
    ns["check_linear"]("row", 2, bias=False)
    with pytest.raises(AssertionError, match="rank 0's output differs from the unsplit layer's"):
        ns["check_linear"]("row", 2)
    with pytest.raises(AssertionError, match="rank 0's output differs"):
        ns["check_branch"]("mlp", 4)
    results, _ = ns["run_on"](2, ns["run_branch"], "mlp", ns["full_mlp"](), torch.zeros(1, 2, 16,
                              dtype=torch.float64), torch.ones(1, 2, 16, dtype=torch.float64))
    assert [r[3:] for r in results] == [(["all_reduce"], ["all_reduce"])] * 2


def test_f_without_its_backward_all_reduce_fails_the_values():
    ns = lab_checks()
    exec("class CopyToRanks(CopyToRanks):\n"  # noqa: S102
         "    @staticmethod\n"
         "    def backward(ctx, grad):\n"
         "        return grad, None\n", ns)
    ns["check_operator"](ns["CopyToRanks"], 1)
    with pytest.raises(AssertionError, match="(?s)rank 0's input gradient is .*expected the sum "
                                             "over the ranks of the output gradients"):
        ns["check_operator"](ns["CopyToRanks"], 2)


def test_g_reducing_its_input_in_place_fails_the_count_test_only():
    ns = lab_checks()
    exec("class ReduceFromRanks(ReduceFromRanks):\n"  # noqa: S102
         "    @staticmethod\n"
         "    def forward(ctx, x, comm):\n"
         "        with torch.no_grad():\n"
         "            comm.all_reduce(x)\n"
         "        return x.clone()\n", ns)
    ns["check_operator"](ns["ReduceFromRanks"], 2)
    with pytest.raises(AssertionError, match="(?s)rank 0's input changed .*reduce a copy"):
        ns["check_operator"](ns["ReduceFromRanks"], 2, counts=True)


def test_a_column_layer_that_keeps_every_row_fails_the_shapes():
    ns = lab_checks()
    exec("class ColumnParallelLinear(nn.Module):\n"  # noqa: S102
         "    def __init__(self, linear, comm, gather_output=False):\n"
         "        super().__init__()\n"
         "        self.comm, self.gather_output = comm, gather_output\n"
         "        self.weight = nn.Parameter(linear.weight.detach().clone())\n"
         "        self.bias = nn.Parameter(linear.bias.detach().clone())\n"
         "    def forward(self, x):\n"
         "        y = F.linear(x, self.weight, self.bias)\n"
         "        if self.gather_output:\n"
         "            return y\n"
         "        return y.chunk(self.comm.world_size, dim=-1)[self.comm.rank]\n", ns)
    ns["check_linear"]("column", 1)
    with pytest.raises(AssertionError, match="the weight's gradient, joined from the ranks has "
                                             "shape \\(24, 8\\); the unsplit layer's is "
                                             "\\(12, 8\\)"):
        ns["check_linear"]("column", 2, gather=True)
    with pytest.raises(AssertionError, match="ParallelMLP of n_embd=16 on 2 ranks, batch 2, "
                                             "T=5, seed 0: rank 0's input gradient differs"):
        # f is missing too
        ns["check_branch"]("mlp", 2)


def test_attention_split_without_regrouping_by_heads_is_right_on_one_rank_only():
    ns = lab_checks()
    exec("class ParallelAttention(ParallelAttention):\n"  # noqa: S102
         "    def __init__(self, attn, comm):\n"
         "        super().__init__(attn, comm)\n"
         "        self.qkv = ColumnParallelLinear(attn.qkv, comm)\n", ns)
    ns["check_branch"]("attn", 1)
    with pytest.raises(AssertionError, match="rank 0's output differs"):
        ns["check_branch"]("attn", 2)


def test_a_loss_that_gathers_the_logits_keeps_the_values_and_fails_the_traffic():
    ns = lab_checks()
    exec("def vocab_parallel_cross_entropy(logits, target, comm, ignore_index=-100):\n"  # noqa
         "    whole = GatherFromRanks.apply(logits.contiguous(), comm)\n"
         "    return cross_entropy(whole, target, ignore_index=ignore_index)\n", ns)
    ns["check_loss"](4, ignored=(2,))
    with pytest.raises(AssertionError, match="rank 0 received .* bytes, as much as a rank's "
                                             "slice of the logits"):
        ns["check_traffic"](2)


def test_a_maximum_not_shared_between_the_ranks_fails_the_values():
    ns = lab_checks()
    source = inspect.getsource(ns["vocab_parallel_cross_entropy"])
    own_max = source.replace("maxima.amax(dim=0)", "maxima[comm.rank]")
    assert own_max != source
    exec(own_max, ns)  # noqa: S102
    ns["check_loss"](1)
    with pytest.raises(AssertionError, match="rank 0's loss differs"):
        ns["check_loss"](2)
