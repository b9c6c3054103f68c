"""Sequence parallelism with tensor parallelism (Megatron-SP): the parts of a block that tensor
parallelism leaves whole on every rank, split by sequence instead.

In module 6's `ParallelBlock` every rank holds the whole (B, T, C) activation wherever the
block is not split by heads or features: the LayerNorms, the residual additions, dropout.
Those work token by token, so each rank can keep T/t of the tokens there instead. The block's
boundary operators change accordingly:

- entering a tensor-parallel region (before qkv and fc): all-gather the sequence
  (B, T/t, C) -> (B, T, C), where TP had f (identity forward). Backward: reduce-scatter, which
  sums the ranks' partial input gradients (f's all-reduce) and keeps this rank's tokens;
- leaving it (after the attention's and the MLP's output projections): reduce-scatter the
  partial sums (B, T, C) -> (B, T/t, C), where TP had g's all-reduce. Backward: all-gather.

An all-reduce is a reduce-scatter followed by an all-gather, so the bytes are the same as
tensor parallelism's; what changes is memory: every activation outside the split matmuls is
divided by t. The price is bookkeeping: the LayerNorms' parameters and the output
projections' biases now see only this rank's tokens, so their gradients are partial sums and
must be all-reduced over the tensor-parallel ranks before the optimizer steps
(`sync_replicated_gradients`): forgetting it is the classic mistake, and the ranks' copies
drift apart.

Residual dropout (`dropout`, after each output projection, as module 2's `resid_dropout` and
the MLP's `dropout`) lies in the sequence-split region, so each rank drops its own tokens'
elements. To stay exact against one process, every rank draws the whole (B, T, C) mask from
a generator seeded alike on every rank, in the order and by the same call as `nn.Dropout`
(`bernoulli_`, then divided by 1 - p), and keeps its tokens' slice: the union of the slices is
the mask one process draws after `torch.manual_seed(seed)`. The cost: each rank draws t times
the random numbers it uses and holds a full-size mask for a moment (autograd keeps only its
slice). Seeding per position (a stream per token) would draw only a rank's share, for a
generator call per token, and no longer one process's `nn.Dropout` mask. Megatron-LM draws
each rank's slice from its own stream: cheaper, the same in distribution, other numbers.
(On CUDA, `nn.Dropout`'s fused kernel samples otherwise: the ranks still agree on one mask.)
Attention's dropout on the weights stays 0, as in module 6: it is in the head-split region.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from ..comm import Communicator
from ..context_parallel.gathered import gather_sequence, scatter_sequence
from ..models.gpt import Block, causal_attention
from .blocks import ParallelAttention, ParallelMLP


class SequenceParallelBlock(nn.Module):
    """Module 2's `Block`, tensor-parallel by heads and features as module 6's, and split by
    sequence elsewhere: takes and returns this rank's (B, T/t, C) tokens. `dropout`: the
    residual dropout's probability, its masks drawn from `seed` (the same on every rank)."""

    def __init__(self, block: Block, comm: Communicator, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"SequenceParallelBlock: dropout {dropout} must be in [0, 1)")
        self.comm, self.dropout, self.seed = comm, dropout, seed
        self._generator: torch.Generator | None = None  # made on the activations' device
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.attn = ParallelAttention(block.attn, comm)  # its shards of qkv and proj
        self.mlp = ParallelMLP(block.mlp, comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attention(self._enter(self.ln1(x)))
        return x + self._mlp(self._enter(self.ln2(x)))

    def _enter(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T/t, C) -> (B, T, C); backward: the reduce-scatter (f's all-reduce, then a slice)
        return gather_sequence(x, self.comm, [x.shape[1]] * self.comm.world_size)

    def _leave(self, partial: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # (B, T, C) -> (B, T/t, C); backward: the all-gather
        pieces = [partial.shape[1] // self.comm.world_size] * self.comm.world_size
        y = scatter_sequence(partial, self.comm, pieces)
        return y + bias if bias is not None else y

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        attn = self.attn
        q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).chunk(3, dim=2)  # this rank's heads
        y = causal_attention(q, k, v, q.shape[-1] // attn.n_head, attn.causal)
        return self._drop(self._leave(F.linear(y, attn.proj.weight), attn.proj.bias))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        mlp = self.mlp
        h = F.gelu(F.linear(x, mlp.fc.weight, mlp.fc.bias))
        return self._drop(self._leave(F.linear(h, mlp.proj.weight), mlp.proj.bias))

    def _drop(self, y: torch.Tensor) -> torch.Tensor:
        """Residual dropout of this rank's (B, T/t, C) tokens: its slice of the whole mask."""
        if not self.training or self.dropout == 0.0:
            return y
        if self._generator is None:
            self._generator = torch.Generator(y.device).manual_seed(self.seed)
        B, mine, C = y.shape
        keep = 1.0 - self.dropout
        whole = y.new_empty(B, mine * self.comm.world_size, C)
        mask = whole.bernoulli_(keep, generator=self._generator).div_(keep)
        return y * shard_sequence(mask, self.comm)  # a copy of the slice: the rest is freed

    def replicated_parameters(self) -> list[nn.Parameter]:
        """The parameters every rank holds whole, whose gradients each rank sees only for its
        own tokens: both LayerNorms' and the two output projections' biases."""
        held = [*self.ln1.parameters(), *self.ln2.parameters(), self.attn.proj.bias,
                self.mlp.proj.bias]
        return [p for p in held if p is not None]

    @torch.no_grad()
    def sync_replicated_gradients(self) -> None:
        """Sum the replicated parameters' partial gradients over the ranks (after backward)."""
        for p in self.replicated_parameters():
            if p.grad is not None:
                self.comm.all_reduce(p.grad, "sum")


def shard_sequence(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """This rank's equal share of (B, T, C) `x`'s tokens, (B, T/t, C); T must divide by t."""
    if x.shape[1] % comm.world_size:
        raise ValueError(f"sequence parallelism splits the {x.shape[1]} tokens over "
                         f"{comm.world_size} ranks in equal pieces; choose a sequence length "
                         f"divisible by {comm.world_size}")
    return x.chunk(comm.world_size, dim=1)[comm.rank].contiguous()


__all__ = ["SequenceParallelBlock", "shard_sequence"]
