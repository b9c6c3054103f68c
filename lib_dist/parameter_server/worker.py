"""A parameter-server worker, and the job that puts servers and workers together.

A worker repeats: pull every server's shard, compute a gradient on its own batch, push shard j
of the gradient to server j. It never talks to another worker. It does not know whether the
servers are synchronous or asynchronous: only when their answers come differs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..comm import Communicator, wait_all
from .layout import flat_gradients, flat_parameters, load_flat, shard_bounds, worker_ranks
from .server import Mode, serve

BatchFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def work(comm: Communicator, model: nn.Module, servers: int, steps: int, batch_fn: BatchFn,
         loss_fn: LossFn, cost: float = 0.0) -> list[float]:
    """Run `steps` pull-compute-push rounds against servers 0 .. servers-1, then pull the
    final parameters into `model`. `batch_fn(step)` is this worker's batch for that step;
    `cost`: the virtual time one gradient takes (`lib_dist.comm.clock`). Returns the losses."""
    bounds = shard_bounds(flat_parameters(model).numel(), servers)
    losses = []
    for step in range(steps):
        pull(comm, model, bounds)
        model.zero_grad(set_to_none=True)
        x, y = batch_fn(step)
        with comm.compute("gradient", cost):
            loss = loss_fn(model(x), y)
            loss.backward()
        grad = flat_gradients(model)
        wait_all([comm.isend(grad[lo:hi].clone(), j) for j, (lo, hi) in enumerate(bounds)])
        losses.append(loss.item())
    pull(comm, model, bounds)
    return losses


def pull(comm: Communicator, model: nn.Module, bounds: Sequence[tuple[int, int]]) -> None:
    """Receive every server's shard into the model's parameters."""
    flat = flat_parameters(model)
    shards = [torch.empty_like(flat[lo:hi]) for lo, hi in bounds]
    wait_all([comm.irecv(s, j) for j, s in enumerate(shards)])
    load_flat(model, torch.cat(shards))


@dataclass
class RankResult:
    """What one rank of a parameter-server job ends with. A server: its `shard` and the
    (worker, staleness) of every gradient it applied. A worker: the final `parameters` it
    pulled (flat) and the loss of each of its steps."""

    rank: int
    role: str  # "server" or "worker"
    parameters: torch.Tensor  # a server's shard, or a worker's whole flat vector
    applied: list[tuple[int, int]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def parameter_server(comm: Communicator, model: nn.Module, servers: int, steps: int,
                     lr: float, batch_fn: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
                     loss_fn: LossFn, mode: Mode = "sync", schedule: Sequence[int] | None = None,
                     lr_for_staleness: Callable[[int], float] | None = None,
                     costs: dict[int, float] | None = None) -> RankResult:
    """One rank's part of a job of `servers` servers (ranks 0 ..) and workers (the rest).
    Every rank passes the same initial `model` (a worker trains a copy of it, so simulated
    ranks may share one); `batch_fn(worker_rank, step)` is a worker's batch. `costs`: each worker rank's virtual time per gradient (on a virtual clock)."""
    workers = worker_ranks(servers, comm.world_size)
    if comm.rank < servers:
        lo, hi = shard_bounds(flat_parameters(model).numel(), servers)[comm.rank]
        shard = flat_parameters(model)[lo:hi].clone()
        applied = serve(comm, shard, workers, steps, lr, mode, schedule, lr_for_staleness)
        return RankResult(comm.rank, "server", shard, applied=applied)
    model = copy.deepcopy(model)
    losses = work(comm, model, servers, steps, lambda step: batch_fn(comm.rank, step), loss_fn,
                  cost=(costs or {}).get(comm.rank, 0.0))
    return RankResult(comm.rank, "worker", flat_parameters(model), losses=losses)


def gather_shards(results: Sequence[RankResult]) -> torch.Tensor:
    """The servers' final parameters, joined into one flat vector."""
    return torch.cat([r.parameters for r in results if r.role == "server"])
