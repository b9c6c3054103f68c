"""Sharding what training holds across the ranks (module 9): ZeRO stage 2, gradients and
optimizer state reduce-scattered bucket by bucket during backward (`Zero2Optimizer`), and
stage 3, parameters too, gathered one unit at a time (`FSDP`). Stage 1 is module 7's
`lib_dist.mixed_precision.ZeroOptimizer`."""

from .fsdp import FSDP
from .zero2 import Zero2Optimizer

__all__ = ["FSDP", "Zero2Optimizer"]
