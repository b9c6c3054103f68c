"""Activation recomputation: keep a block's input, not what it computed, and compute it again
during the backward pass.

Autograd saves, during the forward pass, every tensor a backward formula will need: for a
transformer block, the inputs of each matmul, LayerNorm's statistics, the attention
probabilities... (module 2's activation formula counts them). Recomputation trades that memory
for time: the block runs forward under `torch.no_grad()`, so nothing inside it is saved, and
only its input is kept; when the backward pass reaches the block, it runs the block forward
again, with autograd on, and back-propagates through that fresh graph. The saved memory of a
block drops to its input; the price is one more forward pass of the block (about a third more
FLOPs for a whole step, since a backward pass costs about two forwards).

Two details make the second forward the same as the first:

- random state: dropout draws its mask from the generator. The block's second run must draw
  the same mask, so the generator's state at the first run is kept and restored for the
  second (and the generator is left as it was, so later draws are unaffected);
- what the block reads: the same parameters and input. (Changing a parameter in place between
  forward and backward breaks recomputation, as it breaks autograd.)

Selective recomputation (`selective_blocks`) recomputes less: only attention's core, the
scores, mask, softmax, dropout and weights @ v, whose (B, heads, T, T) tensors grow with the
square of the sequence and cost few FLOPs; the matmuls' outputs (q, k, v, the projections,
the MLP) are kept. Most of the memory of long sequences goes for a few percent more compute.

`checkpoint(fn, *inputs)` is the course's own version of `torch.utils.checkpoint.checkpoint`
(the oracle its tests compare with). Like torch's "reentrant" variant it back-propagates
inside the backward pass: use it with `loss.backward()`, not `torch.autograd.grad`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn

from .models.gpt import CausalSelfAttention, causal_attention


class Recompute(torch.autograd.Function):
    """forward: run `fn` without saving anything but the inputs; backward: run it again."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., torch.Tensor], replay_rng: bool,
                *inputs: torch.Tensor) -> torch.Tensor:
        ctx.fn = fn
        ctx.rng = rng_state(inputs) if replay_rng else None
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        with replayed(ctx.rng), torch.enable_grad():
            output = ctx.fn(*inputs)
        torch.autograd.backward(output, grad_output)  # fills the parameters' .grad too
        return (None, None, *(x.grad if x.requires_grad else None for x in inputs))


def checkpoint(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor,
               replay_rng: bool = True) -> torch.Tensor:
    """`fn(*inputs)`, keeping only `inputs` for the backward pass, which runs `fn` again
    (`replay_rng`: with the random state of the first run, so dropout draws the same mask)."""
    if not all(isinstance(x, torch.Tensor) for x in inputs):
        raise TypeError("checkpoint takes tensors as inputs; bind other arguments into fn "
                        "(functools.partial or a lambda)")
    return Recompute.apply(fn, replay_rng, *inputs)


class Checkpointed(nn.Module):
    """`block`, recomputed in the backward pass (only its input is kept)."""

    def __init__(self, block: nn.Module, replay_rng: bool = True):
        super().__init__()
        self.block, self.replay_rng = block, replay_rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():  # evaluation: nothing would be saved anyway
            return self.block(x)
        return checkpoint(self.block, x, replay_rng=self.replay_rng)


class TorchCheckpointed(nn.Module):
    """`block` under torch's own `torch.utils.checkpoint` (non-reentrant): the oracle."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint as torch_checkpoint

        return torch_checkpoint(self.block, x, use_reentrant=False)


def checkpoint_blocks(blocks: nn.ModuleList, replay_rng: bool = True,
                      wrapper: type[nn.Module] | None = None) -> nn.ModuleList:
    """Wrap each block of `blocks` (a GPT's `blocks`) in `Checkpointed`, in place (or in
    `wrapper`, e.g. `TorchCheckpointed`)."""
    for i, block in enumerate(blocks):
        if not isinstance(block, (Checkpointed, TorchCheckpointed)):
            blocks[i] = Checkpointed(block, replay_rng) if wrapper is None else wrapper(block)
    return blocks


class SelectiveAttention(nn.Module):
    """Module 2's `CausalSelfAttention` whose core (scores to weights @ v) is recomputed in
    backward; its input projection's output (q, k, v) is what stays saved."""

    def __init__(self, attn: CausalSelfAttention, replay_rng: bool = True):
        super().__init__()
        self.attn, self.replay_rng = attn, replay_rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn, C = self.attn, x.shape[2]
        q, k, v = attn.qkv(x).split(C, dim=2)  # each (B, T, C): views of one saved tensor
        core = partial(causal_attention, head_size=C // attn.n_head, causal=attn.causal,
                       dropout=attn.attn_dropout)
        y = checkpoint(core, q, k, v, replay_rng=self.replay_rng) if torch.is_grad_enabled(
        ) else core(q, k, v)
        return attn.resid_dropout(attn.proj(y))


def selective_blocks(blocks: nn.ModuleList, replay_rng: bool = True) -> nn.ModuleList:
    """Recompute only attention's core in each of a GPT's `blocks`, in place."""
    for block in blocks:
        if isinstance(block.attn, CausalSelfAttention):
            block.attn = SelectiveAttention(block.attn, replay_rng)
        elif not isinstance(block.attn, SelectiveAttention):
            raise TypeError(f"selective_blocks recomputes module 2's CausalSelfAttention; "
                            f"this block's attn is a {type(block.attn).__name__}")
    return blocks


def rng_state(inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """The CPU generator's state, and each CUDA device's among `inputs`."""
    devices = sorted({x.device.index or 0 for x in inputs if x.is_cuda})
    return {"cpu": torch.get_rng_state(), "devices": devices,
            "cuda": [torch.cuda.get_rng_state(d) for d in devices]}


@contextmanager
def replayed(state: dict[str, Any] | None) -> Iterator[None]:
    """Run with the generators as `state` had them, then put them back as they are now."""
    if state is None:
        yield
        return
    with torch.random.fork_rng(devices=state["devices"]):
        torch.set_rng_state(state["cpu"])
        for device, cuda_state in zip(state["devices"], state["cuda"]):
            torch.cuda.set_rng_state(cuda_state, device)
        yield


__all__ = ["Checkpointed", "Recompute", "SelectiveAttention", "TorchCheckpointed", "checkpoint",
           "checkpoint_blocks", "replayed", "rng_state", "selective_blocks"]
