"""The model, data and helpers the DistributedOptimizer tests share (test_horovod_optimizer.py,
test_horovod_fusion.py): a plain module, sent to the engines by value."""

from __future__ import annotations

import torch

N, B = 4, 8  # ranks, examples per rank and step


def build(seed):
    """A small classifier with a frozen layer and a layer forward never uses."""
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict(dict(frozen=torch.nn.Linear(6, 6), hidden=torch.nn.Linear(6, 5),
                                     out=torch.nn.Linear(5, 3), unused=torch.nn.Linear(2, 2)))
    model["frozen"].requires_grad_(False)
    return model


def forward(model, x):
    return model["out"](torch.tanh(model["hidden"](model["frozen"](x))))


def batch(step, n):
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, 6, generator=gen), torch.randint(0, 3, (n,), generator=gen)


def shard(step, rank):
    x, y = batch(step, N * B)
    return x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]


def params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def all_reduces(comm):
    return [e for e in comm.trace.events if e.kind == "all_reduce"]
