"""Gradient compression for all-reduce, as Horovod's `hvd.Compression` offers it.

A compressor turns a tensor into what travels (`compress`, returning the tensor to send and
whatever `decompress` needs to undo it) and back (`decompress`). `Compression.fp16` halves the
bytes of every floating tensor on the wire by sending it as float16; the sum is then also
computed in float16, so large gradients may overflow and small ones lose precision: that is
the price of half the traffic, and why it is off by default (`Compression.none`).
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """The interface: a pair of static methods, called on every tensor before and after the
    all-reduce."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(what to send, context for `decompress`)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The reduced tensor, back in the form the caller gave."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating tensors as float16 and casts the result back to their own dtype;
    other dtypes travel unchanged."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.is_floating_point() and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """The compressors by name, as Horovod spells them: `Compression.none`, `Compression.fp16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
