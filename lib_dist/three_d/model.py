"""This rank's piece of the GPT under a (dp, pp, tp) layout.

The GPT as a list of layers (`lib_dist.pipeline.gpt_layers`: Embed, the blocks, Head) is cut
into pp balanced stages; in this rank's stage every transformer block becomes a
tensor-parallel `ParallelBlock` over the `tp` group (its heads and MLP columns split), while
the embedding and the head stay whole on each tp rank (their inputs and gradients are the same
on every tp rank, so the copies stay equal without a collective). Every dp replica builds the
same piece from the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..comm.base import Communicator
from ..comm.mesh import Mesh
from ..models.gpt import Block, GPTConfig
from ..pipeline import Stage, balanced_bounds, gpt_layers, next_token_loss, parameter_count
from ..tensor_parallel import ParallelBlock

NAMES = ("dp", "pp", "tp")


@dataclass(frozen=True)
class Layout:
    """How many ranks along each dimension: dp replicas, pp stages, tp slices."""

    dp: int
    pp: int
    tp: int

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def __str__(self) -> str:
        return f"(dp={self.dp}, pp={self.pp}, tp={self.tp})"


class ThreeD:
    """The mesh, and this rank's stage of the GPT `config` (initialised from `seed`), ready for
    `three_d_step`."""

    def __init__(self, comm: Communicator, layout: Layout, config: GPTConfig, *, seed: int = 0,
                 dtype: torch.dtype = torch.float32):
        check_fits(layout, config)
        self.layout, self.config = layout, config
        self.mesh = Mesh(comm, (layout.dp, layout.pp, layout.tp), NAMES)
        pp, tp = self.mesh["pp"], self.mesh["tp"]
        layers = gpt_layers(config, seed)
        # every stage's [first, last) layer, balanced by parameters as split_model does
        self.bounds = balanced_bounds([parameter_count(layer) for layer in layers], layout.pp)
        first, end = self.bounds[pp.rank]
        module = nn.Sequential(*(ParallelBlock(layer, tp) if isinstance(layer, Block) else layer
                                 for layer in layers[first:end])).to(dtype)
        self.layers = module  # this rank's layers, model layers first..end - 1
        self.stage = Stage(module, pp, boundary_shape=(config.block_size, config.n_embd),
                           dtype=dtype, loss_fn=next_token_loss)

    @property
    def module(self) -> nn.Module:
        return self.stage.module

    def parameters(self) -> list[nn.Parameter]:
        return list(self.stage.module.parameters())


def check_fits(layout: Layout, config: GPTConfig) -> None:
    """A layout the model can take: tp divides the heads (and so the width and the MLP), and
    there are at least as many layers as stages."""
    if config.n_head % layout.tp:
        raise ValueError(f"tp={layout.tp} does not divide the {config.n_head} heads: choose tp "
                         f"among the divisors of n_head")
    if layout.pp > config.n_layer + 2:
        raise ValueError(f"pp={layout.pp} stages for {config.n_layer + 2} layers (the "
                         f"embedding, {config.n_layer} blocks, the head): use at most "
                         f"{config.n_layer + 2} stages")
