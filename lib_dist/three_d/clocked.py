"""A 3D step measured on the virtual clock, priced as the planner prices a step: the check of
the planner's prediction that needs no cluster.

Each rank's stage declares its forward and backward of one micro-batch as the FLOPs of its own
layers (6 per matmul weight a token, a third of them forward, and attention's 12 C T a block
and token split by tp) at the cluster's rate, `flops * mfu`; every message of the step, the
tensor-parallel all-reduces, the stage boundaries and the data-parallel gradient all-reduces,
costs what the cluster's link says (`VirtualClock(message=machines.intra)`: one node). What the
planner leaves out then shows as a difference: the stages' real balance (the embedding and
the head are layers too, and the head is whole on every tp rank), the all-reduce algorithm the
ranks really run, and the gradient all-reduces issued after the pipeline drains rather than
hidden behind the backward pass.
"""

from __future__ import annotations

import torch
from torch import nn

from ..comm import SimulatedWorld, VirtualClock
from ..comm.base import Communicator
from ..models.gpt import Block, GPTConfig
from ..pipeline import StepCosts
from ..tensor_parallel import ParallelBlock
from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from .model import Layout, ThreeD
from .planner import Machines
from .step import three_d_step

MATMULS = (nn.Linear, ColumnParallelLinear, RowParallelLinear)


def stage_flops(three_d: ThreeD, tokens: int) -> float:
    """FLOPs of one forward and backward of this rank's layers over `tokens` tokens: 6 per
    token and matmul weight it holds (its tp slice of a block; the head whole), and 12 C T per
    token and block for attention's scores and weighted sum, split by tp."""
    weights = sum(m.weight.numel() for m in three_d.layers.modules() if isinstance(m, MATMULS))
    blocks = sum(isinstance(m, (ParallelBlock, Block)) for m in three_d.layers)
    config = three_d.config
    attention = 12 * config.n_embd * config.block_size * blocks / three_d.layout.tp
    return tokens * (6 * weights + attention)


def clocked_step(comm: Communicator, layout: Layout, config: GPTConfig, machines: Machines,
                 global_batch: int, micro_batch: int = 1, seed: int = 0) -> float:
    """On one rank of a clocked world: build `layout`'s piece of the GPT, price its stage's
    work on `machines`, run one step on a random batch; the step's virtual seconds."""
    three_d = ThreeD(comm, layout, config, seed=seed)
    flops = stage_flops(three_d, micro_batch * config.block_size)
    rate = machines.flops * machines.mfu
    three_d.stage.costs = StepCosts(forward=flops / 3 / rate, backward=2 * flops / 3 / rate)
    optimizer = torch.optim.SGD(three_d.parameters(), lr=0.1)
    tokens = torch.randint(config.vocab_size, (global_batch, config.block_size + 1),
                           generator=torch.Generator().manual_seed(seed))
    m = global_batch // (layout.dp * micro_batch)
    comm.barrier()
    start = comm.virtual_time()
    three_d_step(three_d, optimizer, tokens[:, :-1], tokens[:, 1:], m)
    comm.barrier()
    now = comm.virtual_time()
    assert now is not None and start is not None  # the world has a clock
    return now - start


def measured_step(layout: Layout, config: GPTConfig, machines: Machines, global_batch: int,
                  micro_batch: int = 1) -> float:
    """One step of `layout` on a simulated world whose virtual clock prices messages with the
    node's link: its virtual seconds (the same on every rank, after the closing barrier)."""
    if layout.world_size > machines.per_node:
        raise ValueError(f"{layout} spans {layout.world_size} ranks; the virtual clock has "
                         f"one link: measure layouts within a node of {machines.per_node}")
    world = SimulatedWorld(layout.world_size, timeout=60, clock=VirtualClock(machines.intra))
    return max(world.run(clocked_step, layout, config, machines, global_batch, micro_batch))


__all__ = ["clocked_step", "measured_step", "stage_flops"]
