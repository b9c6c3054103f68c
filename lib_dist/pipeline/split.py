"""Split a model given as a list of layers into p consecutive, balanced stages.

A stage's cost is the sum of its layers' costs: their parameter counts by default (memory is
what a pipeline splits for), or costs the caller declares (e.g. measured forward times).
`split_model` picks the cut points that make the costliest stage as cheap as possible, by
dynamic programming over (layers so far, stages so far): the pipeline runs at the pace of its
slowest stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from torch import nn


def parameter_count(layer: nn.Module) -> int:
    return sum(p.numel() for p in layer.parameters())


def balanced_bounds(costs: Sequence[float], p: int) -> list[tuple[int, int]]:
    """[start, end) of each of p non-empty consecutive groups of `costs`, minimising the
    largest group sum."""
    n = len(costs)
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    if p > n:
        raise ValueError(f"cannot split {n} layers into {p} non-empty stages: use at most {n} "
                         f"stages, or split the model into more layers")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    @lru_cache(maxsize=None)
    def best(start: int, parts: int) -> tuple[float, tuple[int, ...]]:
        """The smallest largest-group sum of costs[start:] in `parts` groups, and the cuts."""
        if parts == 1:
            return prefix[n] - prefix[start], ()
        options = []
        for cut in range(start + 1, n - parts + 2):
            rest, cuts = best(cut, parts - 1)
            options.append((max(prefix[cut] - prefix[start], rest), (cut, *cuts)))
        return min(options)

    cuts = (0, *best(0, p)[1], n)
    return list(zip(cuts[:-1], cuts[1:]))


def split_model(layers: Sequence[nn.Module], p: int,
                costs: Sequence[float] | None = None) -> list[nn.Sequential]:
    """`layers` as p `nn.Sequential` stages, in order, each layer in exactly one, balanced by
    `costs` (parameter counts if not given)."""
    layers = list(layers)
    if costs is None:
        costs = [parameter_count(layer) for layer in layers]
    if len(costs) != len(layers):
        raise ValueError(f"{len(costs)} costs for {len(layers)} layers: give one per layer")
    return [nn.Sequential(*layers[a:b]) for a, b in balanced_bounds(costs, p)]
