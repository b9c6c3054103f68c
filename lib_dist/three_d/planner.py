"""Which (dp, pp, tp) layout to train a GPT with, and what each costs, before running one.

For a model, a cluster and a global batch, every layout of the cluster's devices is priced:

- memory of the fullest rank: its parameters, gradients and optimizer state (16 bytes a
  parameter with mixed-precision Adam: `lib_dist.tensor_parallel.cost.layout`, Megatron's
  split with the vocabulary split by tp), and the activations 1F1B keeps: the first stage holds
  pp micro-batches' (`activation_bytes_per_layer`, measured against module 6's blocks);
- time of a step: the compute (model FLOPs at the cluster's measured utilisation) stretched by
  the pipeline's bubble, (m + pp - 1) / m; tensor parallelism's four all-reduces a block and
  micro-batch, on the critical path; a stage boundary's activation and gradient per
  micro-batch; data parallelism's gradient all-reduce, of which only what outlasts the backward
  pass shows.

Ranks are numbered tp fastest, then pp, then dp (`lib_dist.comm.mesh.Mesh`): a group runs on
the node's links while its ranks fit in one node, on the network's otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..comm import AlphaBeta
from ..comm.algorithms import RING
from ..models.gpt import GPTConfig
from ..tensor_parallel.cost import block_communication_time, layout as memory_layout
from ..train.utilisation import flops_per_token
from .model import Layout


@dataclass(frozen=True)
class Machines:
    """A cluster: `devices` in nodes of `per_node`, each with `memory` bytes and `flops` peak
    FLOP/s of which a step reaches `mfu`; links inside a node and between nodes."""

    devices: int
    per_node: int
    memory: float
    flops: float
    mfu: float
    intra: AlphaBeta
    inter: AlphaBeta


@dataclass(frozen=True)
class Plan:
    """One layout's price: bytes on the fullest rank and the seconds of one step by part."""

    layout: Layout
    micro_batches: int
    state_bytes: float
    activation_bytes: float
    compute_s: float
    bubble_s: float
    tp_s: float
    pp_s: float
    dp_exposed_s: float

    @property
    def memory(self) -> float:
        return self.state_bytes + self.activation_bytes

    @property
    def step_s(self) -> float:
        return self.compute_s + self.bubble_s + self.tp_s + self.pp_s + self.dp_exposed_s


def activation_bytes_per_layer(config: GPTConfig, batch: int, tp: int, seq_len: int | None = None,
                               bytes_per_element: int = 4) -> int:
    """What one tensor-parallel block saves for backward on one rank (module 2's per-layer
    term, split as module 6's blocks split it): the input, the LayerNorms' outputs and the
    residual between (4 B T C) and the LayerNorms' statistics (4 B T) on every tp rank; the
    attention and MLP tensors (12 B T C) and the scores (B h T^2) split by heads and columns;
    the causal mask (T^2 bytes) whole."""
    B, T, C, h = batch, seq_len or config.block_size, config.n_embd, config.n_head
    elements = 4 * B * T * C + 12 * B * T * C // tp + 4 * B * T + B * h * T * T // tp
    return bytes_per_element * elements + T * T


def link(group_span: int, machines: Machines) -> AlphaBeta:
    """The links a group uses: the node's while the ranks it spans fit in one node."""
    return machines.intra if group_span <= machines.per_node else machines.inter


def price(config: GPTConfig, layout: Layout, machines: Machines, global_batch: int,
          micro_batch: int = 1, bytes_per_element: int = 2) -> Plan:
    """The plan of one layout (`global_batch` sequences of `config.block_size` tokens, cut into
    micro-batches of `micro_batch` per replica)."""
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    if global_batch % (dp * micro_batch):
        raise ValueError(f"a global batch of {global_batch} does not split into dp={dp} "
                         f"replicas of micro-batches of {micro_batch}")
    m = global_batch // (dp * micro_batch)
    T, C = config.block_size, config.n_embd
    state = memory_layout(config, tp, pp, dp).bytes_per_rank
    layers = math.ceil(config.n_layer / pp)
    in_flight = min(pp, m)  # 1F1B: stage 0 holds pp micro-batches' activations at most
    activations = in_flight * layers * activation_bytes_per_layer(config, micro_batch, tp, T,
                                                                  bytes_per_element)
    tokens = global_batch * T
    compute = flops_per_token(config, T) * tokens / (machines.devices * machines.flops
                                                     * machines.mfu)
    bubble = compute * (pp - 1) / m
    tp_s = (m * layers * block_communication_time(micro_batch * T, C, tp, link(tp, machines),
                                                  bytes_per_element) if tp > 1 else 0.0)
    boundary = micro_batch * T * C * bytes_per_element
    pp_s = 2 * m * link(tp * pp, machines).cost(boundary) if pp > 1 else 0.0
    gradients = memory_layout(config, tp, pp, dp, bytes_per_param=bytes_per_element)
    dp_s = (RING.cost(dp, gradients.bytes_per_rank, link(tp * pp * dp, machines))
            if dp > 1 else 0.0)
    backward = compute * 2 / 3  # backward is two thirds of the FLOPs: the all-reduce hides there
    return Plan(layout, m, state, activations, compute, bubble, tp_s, pp_s,
                max(0.0, dp_s - backward))


def plans(config: GPTConfig, machines: Machines, global_batch: int, micro_batch: int = 1,
          max_tp: int | None = None) -> list[Plan]:
    """Every layout of the cluster that the model and batch can take and whose fullest rank
    fits in a device, the fastest first."""
    out = []
    top = max_tp or machines.per_node
    for tp in range(1, min(top, machines.devices) + 1):
        for pp in range(1, min(config.n_layer, machines.devices // tp) + 1):
            if machines.devices % (tp * pp) or config.n_head % tp:
                continue
            dp = machines.devices // (tp * pp)
            if global_batch % (dp * micro_batch):
                continue
            plan = price(config, Layout(dp, pp, tp), machines, global_batch, micro_batch)
            if plan.memory <= machines.memory:
                out.append(plan)
    return sorted(out, key=lambda p: p.step_s)
