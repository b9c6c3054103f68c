"""lib_dist.optim.drift.AdamDrift: how far AdamW carries a parameter away from an oracle's when
the gradients it is fed differ by rounding. Two AdamW runs on the same parameters, one fed
gradients perturbed by at most d per element: where a gradient is small, the parameters part
by far more than their own rounding (what the labs' tests allowed before, and what failed a
correct ZeRO-2 now and then), and never by more than the drift bound."""

from __future__ import annotations

import torch

from lib_dist.optim.drift import AdamDrift

EPS64 = torch.finfo(torch.float64).eps


def run(gradients, start, perturb=None, track=False):
    """AdamW(lr=0.05, weight_decay=0.01) from `start` over `gradients`, each plus `perturb`."""
    p = start.clone().requires_grad_()
    optimizer = torch.optim.AdamW([p], lr=0.05, weight_decay=0.01)
    drift = AdamDrift(optimizer, lambda g: D) if track else None
    for g in gradients:
        p.grad = g + (perturb if perturb is not None else 0)
        optimizer.step()
        if drift is not None:
            drift.step()
    return p.detach(), drift.bound(p) if drift is not None else None


D = 1e-13  # the gradients' rounding: TERMS x eps of O(1) numbers, as the labs' tests bound it


def test_a_small_gradient_turns_rounding_into_a_larger_parameter_error_within_the_bound():
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(64, generator=generator, dtype=torch.float64)
    # gradients from 1e-6 to 1: Adam divides by their running size
    scale = 10.0 ** -torch.linspace(0, 6, 64, dtype=torch.float64)
    gradients = [torch.randn(64, generator=generator, dtype=torch.float64) * scale
                 for _ in range(3)]
    want, bound = run(gradients, start, track=True)
    rounding = 8 * EPS64 * want.abs().max().item()
    widest = 0.0
    for trial in range(20):
        signs = torch.randint(0, 2, (64,), generator=generator).double() * 2 - 1
        got, _ = run(gradients, start, perturb=signs * D * torch.rand(
            64, generator=generator, dtype=torch.float64))
        gap = (got - want).abs()
        assert bool((gap <= rounding + bound).all()), (gap - rounding - bound).max().item()
        widest = max(widest, gap.max().item())
    assert widest > 1000 * rounding  # the plain rounding tolerance would fail a correct run
    assert bound.max().item() < 1e-6 and bound.min().item() < 100 * rounding  # tight where g ~ 1


def test_sgd_has_no_drift_and_an_untouched_parameter_none():
    p, q = torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)
    optimizer = torch.optim.SGD([p, q], lr=0.1, momentum=0.9)
    drift = AdamDrift(optimizer, lambda g: D)
    p.grad = torch.ones(3)
    optimizer.step()
    drift.step()
    assert drift.bound(p).tolist() == [0.0] * 3 and drift.bound(q).tolist() == [0.0] * 2
