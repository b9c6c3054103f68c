"""Which memory savers a GPT's training step needs to fit a device, and what each costs in time
(module 9's planner).

A plan is a ZeRO stage (0: plain data parallelism; 1: optimizer state sharded; 2: gradients
too; 3: parameters too, as FSDP) and a recomputation ("none"; "selective": attention's core;
"full": each block keeps only its input). For each plan, per rank:

- memory: module 7's bytes per parameter under the stage (`zero_bytes_per_rank`; in float32,
  lib_dist's ZeRO-1 also keeps the float32 copy of the shard it steps, which mixed precision
  counts as the master weights; ZeRO-2 steps its shard of the parameters in place), plus
  module 2's activations
  (`gpt_activation_bytes`, float32) less what recomputation drops, plus what a plan holds for
  a moment: the backward pass's own tensors at its fullest (`backward_bytes`); under stage 3
  the gathered root and one gathered block (two with prefetch), and their full gradients (a
  unit's are whole until it reduce-scatters them); under stage 2 one bucket of full
  gradients. The gradients are counted whole, though the backward's peak comes before most
  of them exist: the plan bounds the step's real peak, by at most the gradients' bytes;
- time: the matrix products' FLOPs (6 per parameter of a matrix and token, plus attention's
  12 B T^2 C per layer), recomputation's extra forward FLOPs, at `flops` per second; and the
  communication under the alpha-beta model: the parameters' gradients' ring all-reduce (stages
  0 to 2: 2 (N - 1) / N of the bytes, 2 (N - 1) messages per bucket) or stage 3's two
  all-gathers and a reduce-scatter per unit (3 (N - 1) / N, (N - 1) messages per collective),
  not overlapped with the compute (an upper bound on the step).

`plans(...)` prices every combination; `best(...)` is the fastest that fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..comm import AlphaBeta
from ..mixed_precision.memory import zero_bytes_per_rank, zero_traffic_per_rank
from ..models.gpt import GPTConfig
from ..train.memory import gpt_activation_bytes, gpt_num_params
from ..train.utilisation import flops_per_token

RECOMPUTE = ("none", "selective", "full")
STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Plan:
    """One combination, priced per rank: bytes held, and seconds per step."""

    stage: int
    recompute: str
    state_bytes: float  # parameters, gradients, optimizer state
    activation_bytes: int  # saved by the forward pass for the backward pass
    transient_bytes: float  # held for a moment: the backward's tensors, a gathered unit, a bucket
    compute_s: float
    communication_s: float
    fits: bool

    @property
    def bytes(self) -> float:
        return self.state_bytes + self.activation_bytes + self.transient_bytes

    @property
    def seconds(self) -> float:
        """Compute, then communication: nothing overlapped."""
        return self.compute_s + self.communication_s

    @property
    def name(self) -> str:
        stage = "data parallel" if self.stage == 0 else f"ZeRO-{self.stage}"
        return stage if self.recompute == "none" else f"{stage} + {self.recompute} recompute"


def layer_activation_bytes(config: GPTConfig, batch_size: int, seq_len: int | None = None
                           ) -> int:
    """What one block saves in float32 without recomputation (module 2's per-layer term):
    16 B T C + 4 B T + B h T^2 floats and the T^2 boolean mask."""
    B, T, C, h = batch_size, seq_len or config.block_size, config.n_embd, config.n_head
    return 4 * (16 * B * T * C + 4 * B * T + B * h * T * T) + T * T


def activation_bytes(config: GPTConfig, batch_size: int, recompute: str = "none",
                     seq_len: int | None = None) -> int:
    """Bytes saved by one forward pass (module 2's formula, dropout 0): "selective" drops each
    layer's attention weights (B h T^2 floats) and mask (T^2 bytes); "full" keeps of each layer
    its input only (B T C floats)."""
    _check(recompute=recompute)
    plain = gpt_activation_bytes(config, batch_size, seq_len)
    B, T, C, h, L = (batch_size, seq_len or config.block_size, config.n_embd, config.n_head,
                     config.n_layer)
    if recompute == "selective":
        return plain - L * (4 * B * h * T * T + T * T)
    if recompute == "full":
        return plain - L * layer_activation_bytes(config, B, T) + L * 4 * B * T * C
    return plain


def backward_bytes(config: GPTConfig, batch_size: int, recompute: str = "none",
                   seq_len: int | None = None) -> int:
    """What the backward pass holds on top of the saved activations at its fullest moment,
    float32, dropout 0: the larger of two moments, read from the CPU allocator op by op on the
    tiny GPT (u = 4 B T C bytes, c = 4 B h T^2, l = 4 B T V, and H = 4 (2 B T C + 2 B T +
    B T V) the head's saved tensors, freed before any block's backward):

    - its start: the loss's two logit-sized gradients (of the log-probabilities, of the
      logits), 2 l, every activation still saved;
    - the last block's backward. "none": at attention's softmax, the weights' and the scores'
      gradients (2 c) and those of the attention output and of v (2 u), the block's MLP half,
      attention output and copy of v (12 u) already freed: 2 c - 10 u - H. "selective": the
      same, plus the recomputed weights (c) and the recomputed q, k, v copies and output
      (4 u), the v copy not yet freed (11 u freed): 3 c - 5 u - H. "full": the recomputed
      block's activations (`layer_activation_bytes`) and its output (u), and then either the
      gradient of its MLP's hidden layer (4 u) or, later, "none"'s 2 c - 10 u:
      one block + u + max(4 u, 2 c - 10 u) - H.

    The parameters' gradients made by then are left to the plan's gradients, counted whole.
    """
    _check(recompute=recompute)
    B, T, C, h, V = (batch_size, seq_len or config.block_size, config.n_embd, config.n_head,
                     config.vocab_size)
    u, c, logits = 4 * B * T * C, 4 * B * h * T * T, 4 * B * T * V
    head = 4 * (2 * B * T * C + 2 * B * T) + logits
    if recompute == "full":
        last = layer_activation_bytes(config, B, T) + u + max(4 * u, 2 * c - 10 * u) - head
    elif recompute == "selective":
        last = 3 * c - 5 * u - head
    else:
        last = 2 * c - 10 * u - head
    return max(2 * logits, last)


def step_flops(config: GPTConfig, batch_size: int, recompute: str = "none",
               seq_len: int | None = None) -> int:
    """FLOPs of a forward and backward pass's matrix products: 6 per matrix parameter and
    token, 12 B T^2 C per layer for attention's two products (scores and weights @ v); plus a
    second forward of every block ("full": 2 per layer parameter and token, and 4 B T^2 C) or of
    attention's core alone ("selective": 4 B T^2 C per layer)."""
    _check(recompute=recompute)
    B, T, C, L = batch_size, seq_len or config.block_size, config.n_embd, config.n_layer
    core = 4 * B * T * T * C  # one forward of scores and weights @ v, every head
    flops = flops_per_token(config, T) * B * T  # the model FLOPs (lib_dist.train.utilisation)
    if recompute == "selective":
        flops += L * core
    elif recompute == "full":
        flops += 2 * L * 12 * C * C * B * T + L * core
    return flops


def block_params(config: GPTConfig) -> int:
    """Parameters of one block: 12 C^2 + 13 C."""
    return 12 * config.n_embd ** 2 + 13 * config.n_embd


def price(config: GPTConfig, batch_size: int, world_size: int, stage: int, recompute: str,
          device_bytes: float, network: AlphaBeta = AlphaBeta(), flops: float = 100e12,
          mixed: bool = True, seq_len: int | None = None, bucket_bytes: int = 25 * 2**20,
          prefetch: bool = False) -> Plan:
    """One plan, per rank: `batch_size` sequences of `seq_len` tokens (the context by default)
    on each of `world_size` ranks, `flops` FLOP/s sustained, AdamW (`mixed`: 2 + 2 + 12 bytes
    per parameter, else 4 + 4 + 8)."""
    _check(stage=stage, recompute=recompute)
    N, T = world_size, seq_len or config.block_size
    P = gpt_num_params(config)
    state = zero_bytes_per_rank(stage, N, mixed).total * P
    if stage == 1 and not mixed:  # the float32 copy of the shard ZeRO-1 steps
        state += 4 * P / N
    activations = activation_bytes(config, batch_size, recompute, T)
    param_bytes = 2 if mixed else 4
    transient = float(backward_bytes(config, batch_size, recompute, T))
    if stage == 3:
        root = P - config.n_layer * block_params(config)
        gathered = root + (2 if prefetch else 1) * block_params(config)
        transient += 2 * param_bytes * gathered  # the parameters, and their full gradients
    elif stage == 2:
        transient += min(bucket_bytes, param_bytes * P)
    compute = step_flops(config, batch_size, recompute, T) / flops
    communication = 0.0
    if N > 1:
        sent = zero_traffic_per_rank(stage, N, gradient_bytes=param_bytes) * P
        if stage == 3:
            messages = 3 * (N - 1) * (config.n_layer + 1)  # per unit: 2 gathers, 1 scatter
        else:
            messages = 2 * (N - 1) * -(-param_bytes * P // bucket_bytes)
        communication = messages * network.alpha + sent / network.beta
    total = state + activations + transient
    return Plan(stage, recompute, state, activations, transient, compute, communication,
                fits=total <= device_bytes)


def plans(config: GPTConfig, batch_size: int, world_size: int, device_bytes: float,
          network: AlphaBeta = AlphaBeta(), flops: float = 100e12, mixed: bool = True,
          seq_len: int | None = None, bucket_bytes: int = 25 * 2**20,
          prefetch: bool = False) -> list[Plan]:
    """Every stage with every recomputation, priced as `price` does, fastest first (the fewer
    bytes first among equally fast ones)."""
    found = [price(config, batch_size, world_size, stage, recompute, device_bytes, network,
                   flops, mixed, seq_len, bucket_bytes, prefetch)
             for stage in STAGES for recompute in RECOMPUTE]
    return sorted(found, key=lambda p: (p.seconds, p.bytes))


def best(config: GPTConfig, batch_size: int, world_size: int, device_bytes: float,
         network: AlphaBeta = AlphaBeta(), flops: float = 100e12, mixed: bool = True,
         seq_len: int | None = None, bucket_bytes: int = 25 * 2**20,
         prefetch: bool = False) -> Plan | None:
    """The fastest plan that fits `device_bytes` per rank, or None if none does."""
    return next((p for p in plans(config, batch_size, world_size, device_bytes, network, flops,
                                  mixed, seq_len, bucket_bytes, prefetch) if p.fits), None)


def _check(stage: int = 0, recompute: str = "none") -> None:
    if stage not in STAGES:
        raise ValueError(f"ZeRO stages are 0 (none) to 3, got {stage}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute is one of {RECOMPUTE}, got {recompute!r}")


__all__ = ["Plan", "RECOMPUTE", "STAGES", "activation_bytes", "backward_bytes", "best",
           "block_params", "layer_activation_bytes", "plans", "price", "step_flops"]
