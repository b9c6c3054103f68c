"""Lab 2's tests catch what they promise: gradient accumulation must weight micro-batches by
their counted targets (a loss with ignore_index), so a step that weights them by their share of
the examples, right without ignored targets, keeps the points of Q3's other tests and fails
this one with a message naming the counts. Loaded from solutions/ with `definitions`."""

from __future__ import annotations

import pytest
import torch

from lab_solutions import solution

LAB = "lab02_training"
pytestmark = pytest.mark.timeout(120)


def lab_checks():
    return solution(LAB, "accumulated_step", "check_accumulation", "check_ignored_targets")


def by_examples(model, optimizer, x, y, loss_fn, micro_batches=1):
    """Accumulation weighted by N_i / N: exact for a per-example mean, not with ignore_index."""
    optimizer.zero_grad()
    total = 0.0
    for x_part, y_part in zip(torch.tensor_split(x, micro_batches),
                              torch.tensor_split(y, micro_batches)):
        loss = loss_fn(model(x_part), y_part) * (len(x_part) / len(x))
        loss.backward()
        total += loss.item()
    optimizer.step()
    return total


def test_the_solution_weights_micro_batches_by_counted_targets():
    c = lab_checks()
    c.check_ignored_targets(12, 3, ignored=[0, 1, 2])
    c.check_ignored_targets(10, 3, ignored=[4, 5, 9])
    c.check_ignored_targets(6, 2, ignored=[0, 1, 2])          # one part counts nothing
    c.check_ignored_targets(4, 2, ignored=[1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 15], shape=(4,))
    c.check_ignored_targets(9, 3, ignored=[])                 # none ignored: N_i / N


def test_weighting_by_examples_passes_without_ignored_targets_and_fails_with_them():
    c = lab_checks()
    c.check_accumulation.__globals__["accumulated_step"] = by_examples
    c.check_accumulation(12, 4)
    c.check_ignored_targets(9, 3, ignored=[])
    with pytest.raises(AssertionError, match="12 examples in 3 micro-batches holding \\[1, 4, 4\\] "
                                             "counted targets .* weight each micro-batch by its "
                                             "share of the counted targets"):
        c.check_ignored_targets(12, 3, ignored=[0, 1, 2])
