"""How far Adam's parameters may drift from an oracle's when the gradients carry rounding error.

Tests compare a distributed run's parameters with one process's. Their gradients are the same
sums added in another order, so they differ by rounding, `d` per element at most. SGD passes
that on scaled by the learning rate; Adam does not: its update is lr * m / (sqrt(v) + eps), which
divides by the gradient's own running size, so an element whose gradient is small turns a
rounding error of 1e-13 into a parameter error a thousand times larger. A tolerance of "the
rounding of the parameter" then fails a correct answer now and then, on inputs drawn at random.

`AdamDrift` follows an oracle torch `Adam`/`AdamW` step by step and adds, per element, the
first-order bound on how much each update could move had each gradient been off by `d`:

    lr * d * (1 + |m_hat| / (sqrt(v_hat) + eps)) / (max(sqrt(v_hat) - d, 0) + eps)

(m_hat, v_hat: the bias-corrected moments after the step; a change of d in every gradient
changes m_hat by at most d and sqrt(v_hat) by at most d). `bound(p)` is the sum over the steps:
add it to the parameter's own rounding tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

GradientError = Callable[[torch.Tensor], float]  # a gradient -> its rounding bound per element


class AdamDrift:
    """Call `step()` after each `optimizer.step()` of the oracle (before its gradients are
    zeroed); `gradient_error(grad)` bounds how far another run's gradient may be from it."""

    def __init__(self, optimizer: torch.optim.Optimizer, gradient_error: GradientError):
        self.optimizer, self.gradient_error = optimizer, gradient_error
        self.drift: dict[torch.Tensor, torch.Tensor] = {}

    def step(self) -> None:
        for group in self.optimizer.param_groups:
            if "betas" not in group:  # not Adam: SGD passes rounding on scaled by lr, no more
                continue
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.optimizer.state.get(p, {})
                if p.grad is None or "exp_avg_sq" not in state:
                    continue
                t = float(state["step"])
                m_hat = state["exp_avg"] / (1 - beta1 ** t)
                root = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt()
                d = self.gradient_error(p.grad)
                ratio = m_hat.abs() / (root + group["eps"])
                moved = group["lr"] * d * (1 + ratio) / ((root - d).clamp(min=0) + group["eps"])
                self.drift[p] = self.drift.get(p, torch.zeros_like(p)) + moved.detach()

    def bound(self, p: torch.Tensor) -> torch.Tensor:
        """The drift `p` may have gathered, per element (zeros if it never stepped)."""
        return self.drift.get(p, torch.zeros_like(p)).detach()


__all__ = ["AdamDrift", "GradientError"]
