"""Lab 5's tests catch what they promise, and each typical mistake costs the points of what it
gets wrong and no others: each micro-batch's loss summed instead of averaged fails the
gradients and keeps the clock and the messages; GPipe's order submitted as 1F1B keeps the
gradients and fails the live-activation bound; 1F1B with p - 1 warm-up forwards on every rank
keeps the gradients and fails the makespan; a greedy split fails Q1 only; a loss broadcast from
the last stage fails the messages; a schedule whose stages all receive first fails as a deadlock,
naming every rank and what it waits for; micro-batches cut with `torch.chunk`, which never
refuses a batch that m does not divide, fail Q3's gradients only.

They run the lab's own checks, loaded from solutions/ with `definitions`, on the instructor's
solution and on variants of it (`grader check` runs the whole notebook, its 4 engines too)."""

from __future__ import annotations

import pytest

from lab_solutions import solution

from grader.demo import TYPICAL_BUGS

pytestmark = pytest.mark.timeout(300)

LAB = "lab05_pipeline"
CHECKS = ("check_split", "check_relay", "check_gradients", "check_gpipe_clock",
          "check_1f1b_clock", "check_messages", "check_uneven_batch", "split_model", "gpipe_step",
          "one_f_one_b_step")


def lab_checks():
    """The lab's checks and answers, in the namespace the checks see."""
    return solution(LAB, *CHECKS).check_split.__globals__


def test_the_solution_passes_every_check():
    ns = lab_checks()
    ns["check_split"]([9, 1, 1, 1, 1, 1, 1, 1, 1, 9], 3)
    for n in range(1, 6):
        ns["check_relay"](n)
    for p in range(1, 5):
        for m in (1, 2, 5):
            for step in ("gpipe_step", "one_f_one_b_step"):
                ns["check_gradients"](ns[step], p, m, layers=max(p, 4), seed=m)
                ns["check_messages"](ns[step], p, m)
            ns["check_gpipe_clock"](p, m)
            ns["check_1f1b_clock"](p, m)
    ns["check_uneven_batch"](ns["gpipe_step"], 2, 4, 10)
    ns["check_uneven_batch"](ns["one_f_one_b_step"], 3, 4, 6)


def test_summing_the_micro_batches_losses_fails_the_gradients_only():
    grade_id, source = TYPICAL_BUGS[LAB]
    assert grade_id == "q3-solution"
    ns = lab_checks()
    exec(source, ns)  # noqa: S102 - the bug, as a student would write it
    with pytest.raises(AssertionError, match="it is 4 times as large: is each micro-batch's "
                                             "loss weighted 1/m"):
        ns["check_gradients"](ns["gpipe_step"], 2, 4)
    ns["check_gradients"](ns["gpipe_step"], 2, 1)  # one micro-batch: the sum is the mean
    ns["check_gpipe_clock"](4, 8)
    ns["check_messages"](ns["gpipe_step"], 4, 4)


def test_gpipes_order_handed_in_as_1f1b_fails_the_activation_bound_only():
    ns = lab_checks()
    ns["one_f_one_b_step"] = ns["gpipe_step"]
    ns["check_gradients"](ns["one_f_one_b_step"], 4, 8)
    ns["check_messages"](ns["one_f_one_b_step"], 4, 8)
    ns["check_1f1b_clock"](4, 1)  # one micro-batch: the same steps
    with pytest.raises(AssertionError, match="rank 0 held the activations of 8 micro-batches "
                                             "at once; at most 4 expected"):
        ns["check_1f1b_clock"](4, 8)


def test_a_full_warm_up_on_every_rank_fails_the_makespan_only():
    ns = lab_checks()

    def one_f_one_b_step(comm, stage, inputs, targets, m):
        xs, ys = ns["cut"](inputs, m), ns["cut"](targets, m)
        sends, losses = [], []
        warmup = min(stage.num_stages - 1, m)  # the same on every rank: the last waits
        for j in range(warmup):
            ns["forward_step"](comm, stage, j, xs, ys, sends, losses)
        for j in range(m - warmup):
            ns["forward_step"](comm, stage, j + warmup, xs, ys, sends, losses)
            ns["backward_step"](comm, stage, j, m, len(ys[j]), sends)
        for j in range(m - warmup, m):
            ns["backward_step"](comm, stage, j, m, len(ys[j]), sends)
        return ns["finish"](sends, losses, stage, m)

    ns["one_f_one_b_step"] = one_f_one_b_step
    ns["check_gradients"](one_f_one_b_step, 4, 8)
    with pytest.raises(AssertionError, match="the step took 69 units; \\(m \\+ p - 1\\)\\(1 "
                                             "\\+ 2\\) = 33"):
        ns["check_1f1b_clock"](4, 8)


def test_a_greedy_split_fails_q1():
    ns = lab_checks()

    def split_model(layers, p, costs=None):  # fill each stage up to the mean, then cut
        import torch.nn as nn
        layers = list(layers)
        costs = costs or [sum(q.numel() for q in layer.parameters()) for layer in layers]
        target, stages, current, total = sum(costs) / p, [], [], 0
        for layer, cost in zip(layers, costs):
            if total + cost > target and current and len(stages) < p - 1:
                stages.append(nn.Sequential(*current))
                current, total = [], 0
            current.append(layer)
            total += cost
        return stages + [nn.Sequential(*current)]

    ns["split_model"] = split_model
    ns["check_split"]([5, 5, 5, 5], 2)
    with pytest.raises(AssertionError, match="stage costs \\[1, 13\\], the largest 13; the best "
                                             "split's largest is 10"):
        ns["check_split"]([1, 9, 1, 1, 1, 1], 2)


def test_broadcasting_the_loss_from_the_last_stage_fails_the_messages_only():
    ns = lab_checks()
    gpipe = ns["gpipe_step"]

    def gpipe_step(comm, stage, inputs, targets, m):
        import torch
        loss = gpipe(comm, stage, inputs, targets, m)
        shared = torch.tensor([loss if loss is not None else 0.0], dtype=torch.float64)
        comm.broadcast(shared, stage.num_stages - 1)  # every rank returns the loss
        return shared.item()

    ns["gpipe_step"] = gpipe_step
    ns["check_gradients"](gpipe_step, 3, 2)
    ns["check_gpipe_clock"](3, 2)
    with pytest.raises(AssertionError, match="messages went \\(from, to\\)"):
        ns["check_messages"](gpipe_step, 3, 2)


def test_stages_that_all_receive_first_fail_as_a_deadlock_naming_every_rank():
    ns = lab_checks()
    forward_step = ns["forward_step"]

    def backward_first(comm, stage, j, xs, ys, sends, losses):
        if not stage.is_last:  # waits for a gradient of an output it has not computed
            ns["recv_backward"](comm, stage, len(ys[j]))
        forward_step(comm, stage, j, xs, ys, sends, losses)

    ns["forward_step"] = backward_first
    with pytest.raises(AssertionError) as info:
        ns["check_gradients"](ns["gpipe_step"], 3, 2)
    message = str(info.value)
    assert "DeadlockError" in message
    for rank, peer in [(0, 1), (1, 2), (2, 1)]:
        assert f"rank {rank}: waiting in recv from rank {peer}" in message


def test_micro_batches_cut_by_chunk_fail_q3s_gradients_only():
    ns = lab_checks()
    exec("def cut(batch, m):\n    return batch.chunk(m)\n", ns)  # noqa: S102
    with pytest.raises(AssertionError, match="4 does not divide 10, so there are no 4 equal "
                                             "micro-batches; rank 0's step ran"):
        ns["check_uneven_batch"](ns["gpipe_step"], 2, 4, 10)
    with pytest.raises(AssertionError, match="IndexError"):  # chunk made 3 of 2, not 4
        ns["check_uneven_batch"](ns["gpipe_step"], 3, 4, 6)
    for p, m in ((1, 1), (2, 4), (4, 8)):  # batches that m divides: chunk is right
        ns["check_gradients"](ns["gpipe_step"], p, m)
        ns["check_gradients"](ns["one_f_one_b_step"], p, m)
        ns["check_gpipe_clock"](p, m)
        ns["check_1f1b_clock"](p, m)
        ns["check_messages"](ns["gpipe_step"], p, m)
