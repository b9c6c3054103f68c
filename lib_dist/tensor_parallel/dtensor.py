"""The oracle: the same blocks parallelised by `torch.distributed.tensor.parallel`.

torch's tensor parallelism shards a module's parameters as DTensors over a device mesh:
`ColwiseParallel` splits a linear layer's output features, `RowwiseParallel` its input
features and all-reduces the partial outputs: Megatron's plan, declared instead of written.
It needs a real torch.distributed group (a `lib_dist.cluster` engine, or torchrun), gloo on
CPU or NCCL on GPUs, and runs on a copy of the module, so that the original stays whole.

Its attention plan needs separate query, key and value projections (a fused one would be
split across q, k and v, not across heads), so `SplitQKVAttention` unfuses
`CausalSelfAttention`'s; `gradients` fuses them back, under the original's names.

`torch.distributed.tensor` is imported where it is used: importing it costs about 0.75 s of
CPU (500 modules), which every graded kernel would pay when it imports lib_dist whole.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..models.gpt import CausalSelfAttention, FeedForward, causal_attention


def device_mesh(world_size: int, device: torch.device | str = "cpu") -> DeviceMesh:
    """A one-dimensional mesh over the default group's ranks (collective: every rank)."""
    return init_device_mesh(torch.device(device).type, (world_size,))


class SplitQKVAttention(nn.Module):
    """`CausalSelfAttention` with its fused query/key/value projection as three."""

    causal: torch.Tensor

    def __init__(self, attn: CausalSelfAttention):
        super().__init__()
        width = attn.proj.in_features
        self.head_size = width // attn.n_head
        self.q, self.k, self.v = (nn.Linear(width, width, dtype=attn.qkv.weight.dtype)
                                  for _ in range(3))
        with torch.no_grad():
            for part, w, b in zip((self.q, self.k, self.v), attn.qkv.weight.chunk(3),
                                  attn.qkv.bias.chunk(3)):
                part.weight.copy_(w)
                part.bias.copy_(b)
        self.proj = copy.deepcopy(attn.proj)
        self.register_buffer("causal", attn.causal.clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Sharded, q(x) holds this rank's heads only
        y = causal_attention(self.q(x), self.k(x), self.v(x), self.head_size, self.causal)
        return self.proj(y)


def torch_parallel_mlp(mlp: FeedForward, mesh: DeviceMesh) -> nn.Module:
    """A copy of `mlp` with fc column-wise and proj row-wise parallel over `mesh`."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(copy.deepcopy(mlp), mesh,
                              {"fc": ColwiseParallel(), "proj": RowwiseParallel()})


def torch_parallel_attention(attn: CausalSelfAttention, mesh: DeviceMesh) -> nn.Module:
    """`attn` unfused, its q, k, v column-wise and proj row-wise parallel over `mesh`."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
            "proj": RowwiseParallel()}
    return parallelize_module(SplitQKVAttention(attn), mesh, plan)


def gradients(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient (DTensors gathered), q/k/v fused back into "qkv"."""
    from torch.distributed.tensor import DTensor

    grads = {}
    for name, p in module.named_parameters():
        if p.grad is not None:
            g = p.grad
            grads[name] = g.full_tensor() if isinstance(g, DTensor) else g
    if isinstance(module, SplitQKVAttention):
        for kind in ("weight", "bias"):
            grads[f"qkv.{kind}"] = torch.cat([grads.pop(f"{p}.{kind}") for p in "qkv"])
    return grads
