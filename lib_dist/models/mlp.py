"""A multilayer perceptron: the classifier of the digits experiments."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """Linear layers with ReLU between them; returns logits (no softmax: the loss applies it).

    `MLP(64, [128, 64], 10)` maps a batch of 64 features to 10 class logits. Inputs of any
    shape `(N, ...)` are flattened to `(N, n_in)` first.
    """

    def __init__(self, n_in: int, hidden: Sequence[int], n_out: int, dropout: float = 0.0):
        super().__init__()
        sizes = [n_in, *hidden, n_out]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
                if dropout:
                    layers.append(nn.Dropout(dropout))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))
