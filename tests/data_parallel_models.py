"""Models, data and the single-process oracle of the data-parallel tests.

A plain module (no pytest import): the cluster test sends it to the engines by value. Models
are float64 so that "N ranks of batch B equal one process of batch N * B" holds to 1e-12,
whatever order the all-reduce adds in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

D_IN, WIDTH, CLASSES = 4, 6, 3
TRIGGER = 4.0  # rows whose first feature exceeds this go through `Toy.sometimes`
DTYPE = torch.float64

Batch = tuple[torch.Tensor, torch.Tensor]


class Toy(nn.Module):
    """Every kind of parameter data parallelism must handle: a frozen weight (`frozen.weight`),
    a weight used twice (`enc` and `dec` share it), one used only by rows whose first feature
    exceeds TRIGGER (`sometimes`: unused on the ranks whose shard has none), and one never
    used (`never`)."""

    def __init__(self, seed: int):
        super().__init__()
        self.body = nn.Linear(D_IN, WIDTH)
        self.frozen = nn.Linear(WIDTH, WIDTH)
        self.enc = nn.Linear(WIDTH, WIDTH, bias=False)
        self.dec = nn.Linear(WIDTH, WIDTH, bias=False)
        self.dec.weight = self.enc.weight
        self.sometimes = nn.Linear(WIDTH, WIDTH)
        self.never = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.to(DTYPE)
        generator = torch.Generator().manual_seed(seed)  # not the global one: ranks are threads
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator, dtype=DTYPE) * 0.5)
        self.frozen.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        h = torch.tanh(self.frozen(h))
        h = torch.tanh(self.dec(torch.tanh(self.enc(h))))
        rows = x[:, 0] > TRIGGER
        if rows.any():
            h = h + rows[:, None] * self.sometimes(h)
        return self.head(h)


def batches(steps: int, world: int, per_rank: int, seed: int = 0,
            trigger_rank: int | None = None) -> list[Batch]:
    """Whole batches of world * per_rank rows; only the shard of `trigger_rank` (if any) has
    rows that use `Toy.sometimes`."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        x = torch.randn(world * per_rank, D_IN, generator=generator, dtype=DTYPE).clamp(-3, 3)
        if trigger_rank is not None:
            x[trigger_rank * per_rank, 0] = TRIGGER + 1
        y = torch.randint(CLASSES, (world * per_rank,), generator=generator)
        out.append((x, y))
    return out


def shard(batch: Batch, rank: int, world: int) -> Batch:
    x, y = batch
    per_rank = len(x) // world
    return x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]


def optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def train(model: nn.Module, opt: torch.optim.Optimizer, data: list[Batch],
          after_backward: Callable[[], None] = lambda: None) -> None:
    """Plain steps of mean cross-entropy; `after_backward` is where the naive version averages."""
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        after_backward()
        opt.step()


def oracle(seed: int, opt_name: str, data: list[Batch]) -> Toy:
    """One process, whole batches: what every rank must end with."""
    model = Toy(seed)
    train(model, optimizer(opt_name, model), data)
    return model


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: None if p.grad is None else p.grad.clone()
            for name, p in model.named_parameters()}


def assert_same_params(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
                       tol: float = 1e-12) -> None:
    assert list(got) == list(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=tol, atol=tol, msg=name)
