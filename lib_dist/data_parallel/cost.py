"""Where the time of a data-parallel step goes: compute against communication, on paper.

Compute: a training step of a transformer costs about 6 FLOPs per parameter per token (2 in
forward, 4 in backward; attention's own FLOPs left out), so a rank that trains on `tokens`
tokens at a sustained `flops` FLOP/s computes for 6 * params * tokens / flops seconds, a third
of it in forward.

Communication: one ring all-reduce of the gradient per step, in buckets of at most
`bucket_bytes`. Under the alpha-beta model (`lib_dist.comm.AlphaBeta`) a ring over N ranks
costs, per bucket of b bytes, 2(N-1) alpha + 2 (N-1)/N b / beta
(`lib_dist.comm.algorithms.RING.cost`), so the whole gradient of G bytes in k buckets costs
2(N-1) k alpha + 2 (N-1)/N G / beta.

Without overlap the step takes compute + communication; with perfect overlap, no less than
forward + max(backward, communication): the bounds between which a real step falls.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..comm import AlphaBeta
from ..comm.algorithms import RING
from ..models.gpt import GPTConfig
from ..train.memory import gpt_num_params

FLOPS_PER_PARAM_TOKEN = 6
# GPT-2's four sizes (vocabulary 50257, context 1024), as lib_dist's GPT builds them.
GPT2_SIZES: dict[str, GPTConfig] = {
    "gpt2": GPTConfig(50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": GPTConfig(50257, block_size=1024, n_layer=24, n_head=16, n_embd=1024),
    "gpt2-large": GPTConfig(50257, block_size=1024, n_layer=36, n_head=20, n_embd=1280),
    "gpt2-xl": GPTConfig(50257, block_size=1024, n_layer=48, n_head=25, n_embd=1600),
}


@dataclass(frozen=True)
class StepEstimate:
    """Seconds of one step on each rank (see the module docstring)."""

    params: int
    world_size: int
    tokens: int  # per rank and step
    buckets: int
    compute: float
    communication: float

    @property
    def forward(self) -> float:
        return self.compute / 3

    @property
    def backward(self) -> float:
        return self.compute - self.forward

    @property
    def without_overlap(self) -> float:
        return self.compute + self.communication

    @property
    def with_overlap(self) -> float:
        """The lower bound: communication hidden behind backward as far as it fits."""
        return self.forward + max(self.backward, self.communication)

    @property
    def communication_share(self) -> float:
        """The fraction of a step without overlap spent communicating."""
        return self.communication / self.without_overlap


def gradient_all_reduce_time(world_size: int, gradient_bytes: int, network: AlphaBeta,
                             bucket_bytes: int) -> tuple[float, int]:
    """(seconds, buckets) for ring all-reduces of `gradient_bytes` in buckets of at most
    `bucket_bytes`, the last one holding the remainder."""
    if gradient_bytes <= 0 or bucket_bytes <= 0:
        raise ValueError("gradient_bytes and bucket_bytes must be positive")
    full, rest = divmod(gradient_bytes, bucket_bytes)
    sizes = [bucket_bytes] * full + ([rest] if rest else [])
    return sum(RING.cost(world_size, b, network) for b in sizes), len(sizes)


def estimate_step(params: int, world_size: int, tokens: int, network: AlphaBeta, flops: float,
                  bytes_per_gradient: int = 4, bucket_bytes: int = 25 * 2**20) -> StepEstimate:
    """Compute and communication of one data-parallel step: `params` parameters, `tokens`
    tokens per rank, `flops` FLOP/s sustained per rank, gradients of `bytes_per_gradient`
    bytes (4: float32, 2: bfloat16) all-reduced by a ring in buckets of `bucket_bytes`."""
    if params <= 0 or tokens <= 0 or flops <= 0 or world_size < 1:
        raise ValueError("params, tokens, flops and world_size must be positive")
    compute = FLOPS_PER_PARAM_TOKEN * params * tokens / flops
    communication, buckets = gradient_all_reduce_time(
        world_size, params * bytes_per_gradient, network, bucket_bytes)
    return StepEstimate(params, world_size, tokens, buckets, compute, communication)


def gpt2_params() -> dict[str, int]:
    """Parameters of each of GPT-2's sizes, counted as `lib_dist.models.GPT` builds them."""
    return {name: gpt_num_params(config) for name, config in GPT2_SIZES.items()}
