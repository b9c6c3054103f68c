"""lib_dist.losses against torch's functions: values, gradients, and the extreme inputs where a
naive implementation overflows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lab_solutions import solution
from tolerances import tolerance, worst

from lib_dist.losses import (
    binary_cross_entropy_with_logits, cross_entropy, log_softmax, next_token_loss)

GEN = torch.Generator().manual_seed(0)
EXTREME = torch.tensor([[1e4, -1e4, 0.0], [1e4, 1e4, 1e4], [-1e4, -1e4 + 1, -1e4 + 2]])


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_log_softmax_matches_torch(dim):
    z = torch.randn(5, 7, generator=GEN, dtype=torch.float64)
    want = torch.log_softmax(z, dim)
    # |z - max| <= |log p|; the log of a sum of terms <= 1 errs by eps per level of the sum
    assert worst(log_softmax(z, dim), want) <= tolerance(z.dtype, want.abs().max() + 1,
                                                          z.shape[dim])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_softmax_does_not_overflow(dtype):
    z = EXTREME.to(dtype)
    naive = z - z.exp().sum(-1, keepdim=True).log()
    assert not torch.isfinite(naive).all()  # the problem is real
    got = log_softmax(z)
    assert torch.isfinite(got).all()
    want = torch.log_softmax(z, -1)
    assert worst(got, want) <= tolerance(dtype, want.abs().max() + 1, 3)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignore", [None, -100, 2])
def test_cross_entropy_value_and_gradient_match_torch(reduction, ignore):
    z = torch.randn(9, 5, generator=GEN, dtype=torch.float64)
    target = torch.randint(5, (9,), generator=GEN)
    kwargs = {"reduction": reduction}
    if ignore == -100:
        target[::3] = -100
    if ignore is not None:
        kwargs["ignore_index"] = ignore
    ours, theirs = z.clone().requires_grad_(), z.clone().requires_grad_()
    a, b = cross_entropy(ours, target, **kwargs), F.cross_entropy(theirs, target, **kwargs)
    a.backward()
    b.backward()
    rows = int((target != kwargs.get("ignore_index", -100)).sum())
    magnitude = b.abs() + (rows if reduction == "sum" else 1)  # + each row's log-sum-exp error
    assert worst(a, b) <= tolerance(z.dtype, magnitude, z.numel())
    largest = 1 / rows if reduction == "mean" else 1  # softmax - one-hot is in [-1, 1]
    assert worst(ours.grad, theirs.grad) <= tolerance(z.dtype, largest, z.shape[1])


def test_cross_entropy_gradient_is_softmax_minus_onehot():
    z = torch.randn(4, 6, generator=GEN, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 5, 2, 2])
    cross_entropy(z, target, reduction="sum").backward()
    expected = torch.softmax(z.detach(), 1) - F.one_hot(target, 6)
    assert worst(z.grad, expected) <= tolerance(z.dtype, 1, z.shape[1])


def test_cross_entropy_extremes_large_vocabulary_and_one_counted_target():
    for t in ([0, 1, 2], [1, 0, 0]):
        target = torch.tensor(t)
        want = F.cross_entropy(EXTREME, target)
        assert worst(cross_entropy(EXTREME, target), want) <= tolerance(
            EXTREME.dtype, want + 1, EXTREME.numel())
    z = torch.randn(4, 50_000, generator=GEN)
    target = torch.tensor([-100, 49_999, -100, -100])
    got, want = cross_entropy(z, target), F.cross_entropy(z, target)
    assert worst(got, want) <= tolerance(z.dtype, want + 1, z.numel())
    assert worst(got, -torch.log_softmax(z[1], 0)[49_999]) <= tolerance(z.dtype, want + 1,
                                                                        z.numel())


def test_cross_entropy_rejects_bad_input():
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), reduction="none")
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_binary_cross_entropy_matches_torch_everywhere(reduction):
    z = torch.tensor([0.0, 0.0, 3.0, -2.5, 40.0, -40.0, 1e4, -1e4], dtype=torch.float64)
    y = torch.tensor([1.0, 0.0, 0.3, 1.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    ours, theirs = z.clone().requires_grad_(), z.clone().requires_grad_()
    a = binary_cross_entropy_with_logits(ours, y, reduction)
    b = F.binary_cross_entropy_with_logits(theirs, y, reduction=reduction)
    a.backward()
    b.backward()
    # each term rounds relative to |z| + 1 (it can be 0 while (1 - y) z is large)
    sizes = z.abs() + 1
    magnitude = sizes.sum() if reduction == "sum" else sizes.mean()
    assert worst(a, b) <= tolerance(z.dtype, magnitude, z.numel())
    # including at z = 0, where max(z, 0) + log1p(exp(-|z|)) gets the gradient wrong
    largest = 1 if reduction == "sum" else 1 / z.numel()  # |sigmoid(z) - y| <= 1
    assert worst(ours.grad, theirs.grad) <= tolerance(z.dtype, largest)


def test_binary_cross_entropy_is_two_class_cross_entropy():
    z = torch.randn(6, generator=GEN, dtype=torch.float64)
    y = torch.tensor([1, 0, 0, 1, 1, 0])
    two_class = torch.stack([torch.zeros_like(z), z], dim=1)  # class 1 has logit z
    assert worst(binary_cross_entropy_with_logits(z, y.double()), cross_entropy(two_class, y)) \
        <= tolerance(z.dtype, (z.abs() + 1).mean(), two_class.numel())


def test_next_token_loss_averages_over_every_position():
    logits = torch.randn(2, 5, 7, generator=GEN)
    targets = torch.randint(7, (2, 5), generator=GEN)
    per_position = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    assert worst(next_token_loss(logits, targets), per_position.mean()) <= tolerance(
        logits.dtype, per_position.mean() + 1, logits.numel())


def test_instructor_cross_entropy_has_a_correct_hand_written_backward():
    """Lab 1's solution, loaded from solutions/: gradcheck in float64, ignored targets too."""
    lab = solution("lab01_cross_entropy", "cross_entropy", "log_softmax")
    z = torch.randn(6, 5, generator=GEN, dtype=torch.float64, requires_grad=True)
    for target in (torch.tensor([0, 4, 1, 1, 2, 3]), torch.tensor([-100, -100, 3, -100, 0, -100])):
        for reduction in ("mean", "sum"):
            loss = lab.cross_entropy(z, target, reduction)
            assert type(loss.grad_fn).__name__ == "CrossEntropyBackward"
            want = cross_entropy(z, target, reduction)
            rows = int((target != -100).sum()) if reduction == "sum" else 1
            assert worst(loss, want) <= tolerance(z.dtype, want.abs() + rows, z.numel())
            assert torch.autograd.gradcheck(lambda z: lab.cross_entropy(z, target, reduction), (z,))
    want = log_softmax(EXTREME)
    assert worst(lab.log_softmax(EXTREME), want) <= tolerance(EXTREME.dtype,
                                                              want.abs().max() + 1, 3)
