"""Reference losses: numerically stable log-softmax, cross-entropy and binary cross-entropy.

These are the course's reference implementations, written with plain tensor operations so that
autograd derives their gradients. Lab 1 asks students to write the same losses with the
backward pass by hand (a `torch.autograd.Function`); later labs use a student's own
`cross_entropy` when it agrees with this one, and fall back to this one otherwise.

Conventions follow `torch.nn.functional`: logits are `(N, C)`, targets are class indices `(N,)`,
`reduction` is "mean" or "sum", and targets equal to `ignore_index` contribute nothing (the mean
is over the targets that are not ignored).
"""

from __future__ import annotations

from typing import Literal

import torch

Reduction = Literal["mean", "sum"]


def log_softmax(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log(softmax(logits)) along `dim`, computed as z - max(z) - log(sum(exp(z - max(z)))).

    Subtracting the maximum first keeps every exp() in (0, 1]: exp(1000.0) overflows to inf in
    any float type, exp(1000.0 - 1000.0) = 1 does not. The result is unchanged, because
    log-softmax is invariant to adding a constant to all logits.
    """
    shifted = logits - logits.amax(dim=dim, keepdim=True).detach()
    return shifted - shifted.exp().sum(dim=dim, keepdim=True).log()


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: Reduction = "mean",
                  ignore_index: int = -100) -> torch.Tensor:
    """-log softmax(logits)[target] per row, reduced by "mean" (over rows not ignored) or
    "sum". Its gradient with respect to the logits is softmax(logits) - onehot(target), per
    row, divided by the number of rows counted for "mean"."""
    _check_reduction(reduction)
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"expected logits (N, C) and target (N,), got {tuple(logits.shape)} "
                         f"and {tuple(target.shape)}")
    keep = target != ignore_index
    picked = log_softmax(logits, dim=1).gather(1, target.where(keep, 0).unsqueeze(1)).squeeze(1)
    total = -(picked * keep).sum()
    return total / keep.sum() if reduction == "mean" else total


def binary_cross_entropy_with_logits(logit: torch.Tensor, target: torch.Tensor,
                                     reduction: Reduction = "mean") -> torch.Tensor:
    """Binary cross-entropy of sigmoid(logit) against targets in [0, 1], from the raw logit.

    -[y log s(z) + (1 - y) log(1 - s(z))] = (1 - y) z + log(e^0 + e^-z), and the last term is a
    log-sum-exp computed with the max trick: no exp() of a positive number, no log(0), for any
    z. (The common form max(z, 0) - z y + log(1 + exp(-|z|)) has the same values, but autograd
    gets its gradient wrong at exactly z = 0.) It is the two-class case of `cross_entropy`, with
    logits (z, 0).
    """
    _check_reduction(reduction)
    m = (-logit).clamp(min=0)
    losses = (1 - target) * logit + m + torch.log(torch.exp(-m) + torch.exp(-logit - m))
    return losses.mean() if reduction == "mean" else losses.sum()


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, loss_fn=cross_entropy
                    ) -> torch.Tensor:
    """Mean cross-entropy of a language model's logits `(B, T, V)` against the next tokens
    `(B, T)`: every position of every sequence is one classification over the vocabulary."""
    return loss_fn(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
