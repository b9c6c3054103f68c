"""How much of the hardware a training step uses: model FLOPs per token, the peak matmul rate
measured, and their ratio, model FLOPs utilisation (MFU).

A training step of a GPT does, per token, 6 FLOPs per weight of every matmul (2 forward: a
multiply and an add; 4 backward: the input's gradient and the weight's) and, in attention,
12 x n_layer x n_embd x T more (the scores q k^T and the weighted sum of v, each 2 T C per token
forward, twice that backward). Embedding lookups, LayerNorms, softmax and the optimizer are
not matmuls and are left out, as in the PaLM paper's accounting; the count is of full (not
causal-halved) attention, what the written-out attention computes. MFU = model FLOPs per
second / the device's peak: a number that hardware FLOP counters cannot inflate with
recomputation (recomputed FLOPs are not model FLOPs).

The peak is measured, not read from a datasheet: the best rate of a large square matmul in
the step's dtype on this device (`peak_matmul_flops`).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from ..models.gpt import GPTConfig


def matmul_weights(config: GPTConfig) -> int:
    """Weights of the GPT's matmuls: each block's qkv, proj, fc and proj, and the head."""
    C = config.n_embd
    per_block = C * 3 * C + C * C + C * 4 * C + 4 * C * C
    return config.n_layer * per_block + config.vocab_size * C


def flops_per_token(config: GPTConfig, seq_len: int | None = None) -> int:
    """Model FLOPs of one training step (forward and backward) per token of a sequence of
    `seq_len` (default: block_size): 6 per matmul weight, plus 12 L C T for attention."""
    T = seq_len or config.block_size
    return 6 * matmul_weights(config) + 12 * config.n_layer * config.n_embd * T


def counted_flops_per_token(model: nn.Module, idx: torch.Tensor) -> float:
    """The same, counted by torch's `FlopCounterMode` over one forward and backward of `idx`
    (the oracle of `flops_per_token`)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(idx).float().pow(2).mean().backward()
    return counter.get_total_flops() / idx.numel()


def peak_matmul_flops(device: str = "cpu", dtype: torch.dtype = torch.float32, n: int = 1024,
                      repeats: int = 5) -> float:
    """The best FLOP/s of an (n x n) @ (n x n) matmul over `repeats` runs, on `device`."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms up (threads, kernels, caches)
        _synchronize(device)
        start = time.perf_counter()
        a @ b
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def mfu(tokens_per_second: float, config: GPTConfig, peak: float,
        seq_len: int | None = None) -> float:
    """Model FLOPs utilisation: the model FLOPs done per second over the peak rate."""
    return tokens_per_second * flops_per_token(config, seq_len) / peak


def _synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


__all__ = ["counted_flops_per_token", "flops_per_token", "matmul_weights", "mfu",
           "peak_matmul_flops"]
