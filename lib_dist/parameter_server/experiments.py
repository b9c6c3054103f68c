"""The measurements of course notebook 08, on the digits: small enough that every variant
trains in seconds, real enough that staleness, drift and compression show.

`DigitsTask` splits the digits' training set into one shard per worker, IID (shuffled) or not
(sorted by label, so each worker sees two or three classes), and gives each worker a
deterministic batch per step. Every experiment returns numbers; `plots` draws them.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..comm import Communicator, SimulatedWorld
from ..data import load_digits
from ..losses import cross_entropy
from ..models import MLP
from .averaging import local_sgd
from .compression import TopK, sparse_all_reduce
from .gossip import dpsgd_step, gossip_step
from .layout import flat_gradients, flat_parameters, load_flat
from .replay import replay_async, staleness_aware
from .schedule import round_robin


_BUILDING = threading.Lock()
_MODELS: dict[int, nn.Module] = {}


@dataclass
class DigitsTask:
    """The digits cut into `workers` shards; see the module docstring."""

    workers: int
    batch_size: int = 32
    iid: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        data = load_digits(seed=self.seed)
        self.x, self.y = data.x_train.double(), data.y_train
        self.x_test, self.y_test = data.x_test.double(), data.y_test
        g = torch.Generator().manual_seed(self.seed)
        order = (torch.randperm(len(self.y), generator=g) if self.iid
                 else torch.sort(self.y, stable=True).indices)
        self.shards = list(order.chunk(self.workers))

    def model(self, seed: int = 0) -> nn.Module:
        """A fresh copy of the MLP (64, 32, 10) in float64, the same for a seed on every
        rank: built once, under a lock, without touching torch's global random state (the
        simulated ranks are threads that share it)."""
        with _BUILDING:
            if seed not in _MODELS:
                with torch.random.fork_rng():
                    torch.manual_seed(seed)
                    _MODELS[seed] = MLP(64, [32], 10).double()
            return copy.deepcopy(_MODELS[seed])

    def batch(self, worker: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Worker `worker`'s batch at `step`: the same every time."""
        shard = self.shards[worker]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * worker + step)
        pick = shard[torch.randint(len(shard), (self.batch_size,), generator=g)]
        return self.x[pick], self.y[pick]

    def test_loss(self, model: nn.Module) -> float:
        with torch.no_grad():
            return float(cross_entropy(model(self.x_test), self.y_test))

    def accuracy(self, model: nn.Module) -> float:
        with torch.no_grad():
            return float((model(self.x_test).argmax(1) == self.y_test).double().mean())


def async_curves(task: DigitsTask, worker_counts: Sequence[int], gradients: int, lr: float,
                 aware: bool = False, every: int = 25) -> dict[int, list[tuple[int, float]]]:
    """Test loss against gradients applied, for asynchronous SGD with W equally fast workers
    in turn (staleness W - 1), from one initial model; `aware`: lr / tau."""
    curves = {}
    for w in worker_counts:
        order = round_robin(list(range(w)), -(-gradients // w))[:gradients]
        run = replay_async(task.model(), order, lr, lambda k, s: task.batch(k % task.workers, s),
                           cross_entropy, staleness_aware(lr) if aware else None,
                           task.test_loss, every)
        curves[w] = run.curve
    return curves


def local_sgd_curves(task: DigitsTask, everies: Sequence[int], steps: int, lr: float,
                     weights: Sequence[float] | None = None) -> dict[int, list[float]]:
    """Test loss of the averaged model after each average, for local SGD on `task.workers`
    simulated ranks averaging every H steps (H in `everies`), `steps` local steps in all."""
    base = task.model()

    def run(comm: Communicator, every: int) -> list[float]:
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        weight = weights[comm.rank] if weights else 1.0
        curve = [task.test_loss(model)]
        for start in range(0, steps, every):
            local_sgd(comm, model, optimizer, lambda s: task.batch(comm.rank, start + s),
                      cross_entropy, min(every, steps - start), every, weight)
            curve.append(task.test_loss(model))
        return curve

    return {h: SimulatedWorld(task.workers).run(run, h)[0] for h in everies}


def gossip_errors(world_size: int, steps: int, seed: int = 0) -> list[float]:
    """The distance of the ranks' vectors from their mean, ||x - mean||, before each of
    `steps` gossip steps on a ring of `world_size` simulated ranks (vectors of 16 numbers)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randn(world_size, 16, generator=g, dtype=torch.float64)

    def run(comm: Communicator) -> list[torch.Tensor]:
        x = start[comm.rank].clone()
        seen = []
        for _ in range(steps + 1):
            seen.append(x.clone())
            gossip_step(comm, x)
        return seen

    states = torch.stack([torch.stack(r) for r in SimulatedWorld(world_size).run(run)], 1)
    mean = start.mean(0)
    return [(s - mean).norm().item() for s in states]


def dpsgd_curves(task: DigitsTask, steps: int, lr: float,
                 every: int = 20) -> dict[str, list[tuple[int, float, float]]]:
    """(step, test loss of the ranks' mean model, largest distance of a rank's parameters from
    that mean) for D-PSGD on a ring and for all-reduce SGD, on `task.workers` ranks."""
    base = task.model()

    def run(comm: Communicator, decentralised: bool) -> list[torch.Tensor]:
        model, seen = copy.deepcopy(base), []
        for step in range(steps + 1):
            if step % every == 0:
                seen.append(flat_parameters(model))
            if step == steps:
                break
            model.zero_grad()
            x, y = task.batch(comm.rank, step)
            cross_entropy(model(x), y).backward()
            if decentralised:
                dpsgd_step(comm, model, lr)
            else:
                grad = comm.all_reduce(flat_gradients(model), "avg")
                load_flat(model, flat_parameters(model) - lr * grad)
        return seen

    out = {}
    for name, decentralised in (("D-PSGD (ring)", True), ("all-reduce", False)):
        ranks = SimulatedWorld(task.workers).run(run, decentralised)
        probe, rows = copy.deepcopy(base), []
        for i, snapshot in enumerate(zip(*ranks)):
            mean = torch.stack(snapshot).mean(0)
            load_flat(probe, mean)
            spread = max((s - mean).norm().item() for s in snapshot)
            rows.append((i * every, task.test_loss(probe), spread))
        out[name] = rows
    return out


@dataclass
class CompressedRun:
    ratio: float
    error_feedback: bool
    test_loss: float
    bytes_per_step: float  # sent by one rank, from the trace


def topk_runs(task: DigitsTask, ratios: Sequence[float], steps: int, lr: float,
              error_feedback: Sequence[bool] = (True, False)) -> list[CompressedRun]:
    """Synchronous SGD on `task.workers` ranks whose gradients go through `sparse_all_reduce`
    with top-k (each ratio, with and without error feedback); the test loss after `steps`."""
    base = task.model()

    def run(comm: Communicator, ratio: float, feedback: bool) -> float:
        model, compressor = copy.deepcopy(base), TopK(ratio, feedback)
        for step in range(steps):
            model.zero_grad()
            x, y = task.batch(comm.rank, step)
            cross_entropy(model(x), y).backward()
            update = sparse_all_reduce(comm, compressor, flat_gradients(model))
            load_flat(model, flat_parameters(model) - lr * update)
        return task.test_loss(model)

    runs = []
    for ratio in ratios:
        for feedback in error_feedback if ratio < 1 else (True,):
            world = SimulatedWorld(task.workers)
            loss = world.run(run, ratio, feedback)[0]
            sent = world.trace.summary()[0].sent_bytes / steps
            runs.append(CompressedRun(ratio, feedback, loss, sent))
    return runs
