"""The training loop: steps, periodic evaluation, checkpoints, throughput, a progress bar.

    history = train(model, optimizer, batches, loss_fn, steps=300,
                    eval_fn=lambda m: {"val": evaluate(m, val_batches, loss_fn)}, eval_every=100)

`batches` is any iterator of (x, y) pairs, such as `lib_dist.data.TokenBatches`. The loop itself
is short on purpose; what happens in one step is `step` (see `lib_dist.train.step`), which a
lab replaces with its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..data.batching import Batch
from .checkpoint import save_checkpoint
from .step import LossFn, StepFn, train_step


@dataclass
class History:
    """What a run measured. `tokens` counts targets trained on: tokens for a language model,
    examples for a classifier; `seconds` is the time spent in training steps only (evaluation
    and checkpoints excluded), so `tokens_per_second` is the training throughput."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def eval_curve(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one evaluated quantity, for plotting."""
        return [s for s, e in self.evals], [e[key] for s, e in self.evals]


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Batch], loss_fn: LossFn) -> float:
    """Mean loss over `batches` (weighted by their number of targets), in eval mode, without
    gradients. Pass a fixed list of batches to compare evaluations over a run."""
    was_training = model.training
    model.eval()
    device = _device_of(model)
    total, count = 0.0, 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        total += loss_fn(model(x), y).item() * y.numel()
        count += y.numel()
    model.train(was_training)
    if count == 0:
        raise ValueError("evaluate needs at least one batch")
    return total / count


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows whose largest logit is the target class."""
    was_training = model.training
    model.eval()
    device = _device_of(model)
    correct = (model(x.to(device)).argmax(dim=-1) == y.to(device)).float().mean().item()
    model.train(was_training)
    return correct


def train(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterator[Batch],
          loss_fn: LossFn, steps: int, *, step: StepFn = train_step,
          eval_fn: Callable[[nn.Module], dict[str, float]] | None = None, eval_every: int = 0,
          checkpoint: str | Path | None = None, checkpoint_every: int = 0, start_step: int = 0,
          progress: bool = True, desc: str = "train") -> History:
    """Run steps start_step+1 .. start_step+steps; returns the History.

    `eval_fn(model)` runs every `eval_every` steps and after the last one; a checkpoint (model,
    optimizer, batch stream, step) is written to `checkpoint` every `checkpoint_every` steps and
    after the last one. Batches are moved to the model's device.
    """
    history = History()
    device = _device_of(model)
    model.train()
    bar = tqdm(range(start_step + 1, start_step + steps + 1), desc=desc, disable=not progress)
    for n in bar:
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        started = time.perf_counter()
        loss = step(model, optimizer, x, y, loss_fn)
        _synchronize(device)
        history.seconds += time.perf_counter() - started
        history.tokens += y.numel()
        history.steps.append(n)
        history.losses.append(loss)
        last = n == start_step + steps
        if eval_fn is not None and ((eval_every and n % eval_every == 0) or last):
            history.evals.append((n, eval_fn(model)))
            model.train()
        if checkpoint is not None and ((checkpoint_every and n % checkpoint_every == 0) or last):
            save_checkpoint(checkpoint, model, optimizer, step=n,
                            batches=batches if hasattr(batches, "state_dict") else None)
        latest = history.evals[-1][1] if history.evals else {}
        bar.set_postfix(loss=f"{loss:.3f}", **{k: f"{v:.3f}" for k, v in latest.items()})
    return history


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
