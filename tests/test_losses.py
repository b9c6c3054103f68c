"""lib_dist.losses against torch's functions: values, gradients, and the extreme inputs where a
naive implementation overflows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lab_solutions import solution

from lib_dist.losses import (
    binary_cross_entropy_with_logits, cross_entropy, log_softmax, next_token_loss)

GEN = torch.Generator().manual_seed(0)
EXTREME = torch.tensor([[1e4, -1e4, 0.0], [1e4, 1e4, 1e4], [-1e4, -1e4 + 1, -1e4 + 2]])


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_log_softmax_matches_torch(dim):
    z = torch.randn(5, 7, generator=GEN, dtype=torch.float64)
    assert torch.allclose(log_softmax(z, dim), torch.log_softmax(z, dim), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_softmax_does_not_overflow(dtype):
    z = EXTREME.to(dtype)
    naive = z - z.exp().sum(-1, keepdim=True).log()
    assert not torch.isfinite(naive).all()  # the problem is real
    got = log_softmax(z)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, torch.log_softmax(z, -1), atol=1e-4)


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
    assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(ours.grad, theirs.grad, atol=1e-12)


def test_cross_entropy_gradient_is_softmax_minus_onehot():
    z = torch.randn(4, 6, generator=GEN, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 5, 2, 2])
    cross_entropy(z, target, reduction="sum").backward()
    expected = torch.softmax(z.detach(), 1) - F.one_hot(target, 6)
    assert torch.allclose(z.grad, expected, atol=1e-12)


def test_cross_entropy_extremes_large_vocabulary_and_one_counted_target():
    for t in ([0, 1, 2], [1, 0, 0]):
        target = torch.tensor(t)
        assert torch.allclose(cross_entropy(EXTREME, target), F.cross_entropy(EXTREME, target))
    z = torch.randn(4, 50_000, generator=GEN)
    target = torch.tensor([-100, 49_999, -100, -100])
    assert torch.allclose(cross_entropy(z, target), F.cross_entropy(z, target))
    assert torch.allclose(cross_entropy(z, target), -torch.log_softmax(z[1], 0)[49_999])


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
    assert torch.allclose(a, b, atol=1e-9)
    # including at z = 0, where max(z, 0) + log1p(exp(-|z|)) gets the gradient wrong
    assert torch.allclose(ours.grad, theirs.grad, atol=1e-12)


def test_binary_cross_entropy_is_two_class_cross_entropy():
    z = torch.randn(6, generator=GEN, dtype=torch.float64)
    y = torch.tensor([1, 0, 0, 1, 1, 0])
    two_class = torch.stack([torch.zeros_like(z), z], dim=1)  # class 1 has logit z
    assert torch.allclose(binary_cross_entropy_with_logits(z, y.double()),
                          cross_entropy(two_class, y), atol=1e-12)


def test_next_token_loss_averages_over_every_position():
    logits = torch.randn(2, 5, 7, generator=GEN)
    targets = torch.randint(7, (2, 5), generator=GEN)
    per_position = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    assert torch.allclose(next_token_loss(logits, targets), per_position.mean())


def test_instructor_cross_entropy_has_a_correct_hand_written_backward():
    """Lab 1's solution, loaded from solutions/: gradcheck in float64, ignored targets too."""
    lab = solution("lab01_cross_entropy", "cross_entropy", "log_softmax")
    z = torch.randn(6, 5, generator=GEN, dtype=torch.float64, requires_grad=True)
    for target in (torch.tensor([0, 4, 1, 1, 2, 3]), torch.tensor([-100, -100, 3, -100, 0, -100])):
        for reduction in ("mean", "sum"):
            loss = lab.cross_entropy(z, target, reduction)
            assert type(loss.grad_fn).__name__ == "CrossEntropyBackward"
            assert torch.allclose(loss, cross_entropy(z, target, reduction), atol=1e-12)
            assert torch.autograd.gradcheck(lambda z: lab.cross_entropy(z, target, reduction), (z,))
    assert torch.allclose(lab.log_softmax(EXTREME), log_softmax(EXTREME))
