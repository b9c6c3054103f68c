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

That is the step as a good program runs it. `price(..., as_run=True)` prices instead the step
`three_d_step` runs (`as_run`): stages as unequal as `ThreeD` cuts them (balanced by
parameters; the head whole on every tp rank), their 1F1B timeline, the all-reduce the ranks
really run (`Machines.all_reduce`, measured, where given), and the gradients all-reduced over
dp in one flattened all-reduce after the pipeline drains, nothing hidden behind the
backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..comm import AlphaBeta
from ..comm.algorithms import RING
from ..models.gpt import GPTConfig
from ..tensor_parallel.cost import block_communication_time, layout as memory_layout
from ..train.utilisation import flops_per_token
from . import as_run as run
from .model import Layout


@dataclass(frozen=True)
class Machines:
    """A cluster: `devices` in nodes of `per_node`, each with `memory` bytes and `flops` peak
    FLOP/s of which a step reaches `mfu`; links inside a node and between nodes.
    `all_reduce`: where measured, a whole all-reduce of a group of n ranks as one latency and
    bandwidth, by n (None: a ring over the group's links)."""

    devices: int
    per_node: int
    memory: float
    flops: float
    mfu: float
    intra: AlphaBeta
    inter: AlphaBeta
    all_reduce: Mapping[int, AlphaBeta] | None = None


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


def all_reduce_time(n: int, nbytes: int, machines: Machines) -> float:
    """Seconds of an all-reduce of `nbytes` over a group of n ranks: measured where the
    cluster says, a ring over the group's links otherwise."""
    if n == 1:
        return 0.0
    if machines.all_reduce is not None and n in machines.all_reduce:
        return machines.all_reduce[n].cost(nbytes)
    return RING.cost(n, nbytes, link(n, machines))


def price(config: GPTConfig, layout: Layout, machines: Machines, global_batch: int,
          micro_batch: int = 1, bytes_per_element: int = 2, as_run: bool = False) -> Plan:
    """The plan of one layout (`global_batch` sequences of `config.block_size` tokens, cut into
    micro-batches of `micro_batch` per replica); `as_run`: of the step `three_d_step` runs
    (see the module's docstring)."""
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    if global_batch % (dp * micro_batch):
        raise ValueError(f"a global batch of {global_batch} does not split into dp={dp} "
                         f"replicas of micro-batches of {micro_batch}")
    m = global_batch // (dp * micro_batch)
    T, C = config.block_size, config.n_embd
    if as_run:  # ThreeD's stages: the embedding and the head are layers too (pp may exceed
        state, layers = run.fullest_stage(config, pp, tp)  # n_layer)
    else:
        state = memory_layout(config, tp, pp, dp).bytes_per_rank
        layers = math.ceil(config.n_layer / pp)
    in_flight = min(pp, m)  # 1F1B: stage 0 holds pp micro-batches' activations at most
    activations = in_flight * layers * activation_bytes_per_layer(config, micro_batch, tp, T,
                                                                  bytes_per_element)
    if as_run:
        return Plan(layout, m, state, activations,
                    *priced_as_run(config, layout, machines, m, micro_batch, bytes_per_element))
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


def priced_as_run(config: GPTConfig, layout: Layout, machines: Machines, m: int,
                  micro_batch: int, bytes_per_element: int) -> tuple[float, ...]:
    """(compute, bubble, tp, pp, dp) seconds of the step `three_d_step` runs: the stages'
    1F1B timeline priced three times, compute alone, with the blocks' tp all-reduces, with
    the stage boundaries' messages, each adding its part; then each stage's gradients
    all-reduced over dp, flattened into one, and the loss's two small all-reduces (pp, dp)."""
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    tokens, rate = micro_batch * config.block_size, machines.flops * machines.mfu
    kinds, bounds = run.layer_kinds(config), run.stage_bounds(config, pp)
    activation = tokens * config.n_embd * bytes_per_element
    work, blocks = [], []
    for first, end in bounds:
        mine = kinds[first:end]
        work.append(sum(run.layer_flops_per_token(k, config, tp) for k in mine) * tokens / rate)
        blocks.append(mine.count("block"))
    tp_each = 2 * all_reduce_time(tp, activation, machines)  # f's or g's two, a block and pass

    def ends(with_tp: bool, message: float) -> list[float]:
        forward = [w / 3 + (b * tp_each if with_tp else 0) for w, b in zip(work, blocks)]
        backward = [2 * w / 3 + (b * tp_each if with_tp else 0) for w, b in zip(work, blocks)]
        return run.one_f_one_b_ends(forward, backward, m, message)

    alone, with_tp = max(ends(False, 0.0)), max(ends(True, 0.0))
    full = ends(True, link(tp * pp, machines).cost(activation) if pp > 1 else 0.0)
    gradients = [all_reduce_time(dp, bytes_per_element * sum(  # one all-reduce, flattened
        n for k in kinds[first:end] for n in run.layer_tensors(k, config, tp)), machines)
                 for first, end in bounds]
    loss = all_reduce_time(pp, 8, machines) + all_reduce_time(dp, 8, machines)
    step = max(e + g for e, g in zip(full, gradients)) + loss
    compute = m * max(work)
    return compute, alone - compute, with_tp - alone, max(full) - with_tp, step - max(full)


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
