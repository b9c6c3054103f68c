"""What training holds per parameter, and what ZeRO's stages leave on each of N ranks.

Per parameter, training with Adam holds the parameter, its gradient and two moments. In fp32
that is 4 + 4 + 8 = 16 bytes. Mixed precision keeps the parameter and gradient in 16 bits for
the forward and backward, but the optimizer needs an fp32 master copy besides the two fp32
moments: 2 + 2 + 12 = 16 bytes, the ZeRO paper's accounting. Mixed precision saves no
parameter memory; it halves the activations (and runs faster where the hardware has
half-precision units). The 12 bytes of optimizer state are most of it, which is what ZeRO
shards: stage 1 the optimizer state, stage 2 the gradients too, stage 3 the parameters too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PerParameter:
    """Bytes per parameter of each kind of tensor training keeps for it."""

    parameter: float
    gradient: float
    optimizer_state: float

    @property
    def total(self) -> float:
        return self.parameter + self.gradient + self.optimizer_state


def bytes_per_parameter(mixed: bool, moments: int = 2) -> PerParameter:
    """fp32 training (4, 4, 4 per moment) or mixed precision (2, 2, fp32 master + moments)."""
    if mixed:
        return PerParameter(2, 2, 4 + 4 * moments)
    return PerParameter(4, 4, 4 * moments)


def zero_bytes_per_rank(stage: int, world_size: int, mixed: bool = True,
                        moments: int = 2) -> PerParameter:
    """Bytes per parameter of the model that one of `world_size` ranks holds under ZeRO
    `stage` (0: plain data parallel; 1: optimizer state sharded; 2: and gradients;
    3: and parameters, as FSDP)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stages are 0 (none) to 3, got {stage}")
    whole = bytes_per_parameter(mixed, moments)
    n = world_size
    return PerParameter(whole.parameter / (n if stage >= 3 else 1),
                        whole.gradient / (n if stage >= 2 else 1),
                        whole.optimizer_state / (n if stage >= 1 else 1))


def zero_traffic_per_rank(stage: int, world_size: int, gradient_bytes: float = 2) -> float:
    """Bytes one rank sends per step, per parameter, under ZeRO `stage` with ring collectives:
    an all-reduce of the gradients, 2(N-1)/N, for stage 0; reduce-scatter of the gradients and
    all-gather of the parameters, (N-1)/N each, for stages 1 and 2: the same; stage 3 gathers
    the parameters twice (forward and backward): 3(N-1)/N."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stages are 0 (none) to 3, got {stage}")
    share = (world_size - 1) / world_size * gradient_bytes
    return share * (3 if stage == 3 else 2)
