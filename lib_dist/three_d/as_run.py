"""The pieces of a 3D step as `ThreeD` and `three_d_step` really run them, for the planner to
price (`price(..., as_run=True)`), without building the model.

- the layers: [Embed, Block x n_layer, Head] (`lib_dist.pipeline.gpt_layers`), cut into pp
  stages balanced by parameter count as `ThreeD` cuts them (`balanced_bounds`), so the stages
  are as unequal as the program's;
- a layer's work on one tp rank: a block's matmul FLOPs and attention split by tp, the head
  whole on every tp rank (its input and gradient are the same there), the embedding a lookup
  (no matmul FLOPs);
- a layer's parameter tensors on one tp rank, in `ParallelBlock`'s split: the gradients
  `three_d_step` all-reduces over dp, flattened into one all-reduce, after the pipeline has
  drained;
- the 1F1B timeline of stages whose forward and backward take different times, a message
  between stages leaving when both its send and its receive are posted (as the virtual
  clock, `lib_dist.comm.clock`, times it): each stage's finishing time, once its own sends
  have arrived.
"""

from __future__ import annotations

from ..models.gpt import GPTConfig
from ..pipeline.schedules import Step, one_f_one_b
from ..pipeline.split import balanced_bounds


def layer_kinds(config: GPTConfig) -> list[str]:
    """"embed", "block" x n_layer, "head": the layers `gpt_layers` builds, in order."""
    return ["embed", *["block"] * config.n_layer, "head"]


def layer_tensors(kind: str, config: GPTConfig, tp: int = 1) -> list[int]:
    """Elements of each parameter tensor of one layer on one tp rank, in the order of its
    `parameters()` in `ThreeD` (a block is a `ParallelBlock`, whatever tp)."""
    C, V, T = config.n_embd, config.vocab_size, config.block_size
    if kind == "embed":
        return [V * C, T * C]
    if kind == "head":
        return [C, C, V * C]
    return [C, C, C, C,                         # ln1, ln2 (ParallelBlock's order)
            3 * C * C // tp, 3 * C // tp,       # qkv: column-parallel
            C * C // tp, C,                     # proj: row-parallel, its bias whole
            4 * C * C // tp, 4 * C // tp,       # fc: column-parallel
            4 * C * C // tp, C]                 # proj: row-parallel


def layer_flops_per_token(kind: str, config: GPTConfig, tp: int = 1) -> float:
    """Model FLOPs of one layer's forward and backward per token on one tp rank: 6 per matmul
    weight it holds, and a block's attention, 12 C T, split by heads."""
    C, V, T = config.n_embd, config.vocab_size, config.block_size
    if kind == "embed":
        return 0.0
    if kind == "head":
        return 6.0 * V * C
    return (6.0 * 12 * C * C + 12.0 * C * T) / tp


def stage_bounds(config: GPTConfig, pp: int) -> list[tuple[int, int]]:
    """Each stage's [first, last) layer, as `ThreeD` cuts them (by parameter count)."""
    counts = [sum(layer_tensors(kind, config)) for kind in layer_kinds(config)]
    return balanced_bounds(counts, pp)


def fullest_stage(config: GPTConfig, pp: int, tp: int,
                  bytes_per_param: int = 16) -> tuple[int, int]:
    """(training-state bytes, blocks) of the stage with the most parameters on one tp rank,
    `bytes_per_param` a parameter (16: mixed-precision Adam, as the planner's default)."""
    kinds = layer_kinds(config)
    stages = [kinds[first:end] for first, end in stage_bounds(config, pp)]
    params = [sum(sum(layer_tensors(k, config, tp)) for k in mine) for mine in stages]
    fullest = stages[params.index(max(params))]
    return max(params) * bytes_per_param, fullest.count("block")


def one_f_one_b_ends(forward: list[float], backward: list[float], m: int,
                     message: float) -> list[float]:
    """When each stage finishes its part of a 1F1B step of m micro-batches: stage s's
    forward takes forward[s], its backward backward[s]; a step that needs another stage's
    result starts `message` after both that result and this stage are ready."""
    p = len(forward)
    schedule = one_f_one_b(p, m)
    done: dict[tuple[str, int, int], float] = {}
    free, nxt = [0.0] * p, [0] * p
    delivered = [0.0] * p  # a stage waits for its sends at the end: they arrive when received
    while any(n < len(steps) for n, steps in zip(nxt, schedule)):
        for s, steps in enumerate(schedule):
            while nxt[s] < len(steps):
                step: Step = steps[nxt[s]]
                other = _needs(step, p)
                if other is not None and other not in done:
                    break
                start = free[s]
                if other is not None:
                    start = max(free[s], done[other]) + message
                    delivered[other[2]] = max(delivered[other[2]], start)
                cost = forward[s] if step.kind == "F" else backward[s]
                free[s] = done[(step.kind, step.micro_batch, s)] = start + cost
                nxt[s] += 1
    return [max(f, d) for f, d in zip(free, delivered)]


def _needs(step: Step, p: int) -> tuple[str, int, int] | None:
    """The step of another stage this one waits for: a forward the previous stage's forward,
    a backward the next stage's backward; None for the first forward and the last backward."""
    j, s = step.micro_batch, step.stage
    if step.kind == "F":
        return ("F", j, s - 1) if s > 0 else None
    return ("B", j, s + 1) if s < p - 1 else None
