"""Context parallelism (module 10): one sequence split across ranks (`Layout`: contiguous or
zig-zag), attention computed exactly by passing keys and values around the ring
(`ring_attention`), by all-gathering them (`gathered_attention`), or by trading the sequence
split for a head split with all-to-alls (`ulysses_attention`), the alternatives it is measured
against."""

from .gathered import gathered_attention
from .layout import Layout, even_bounds
from .ring import RingAttention, ring_attention
from .ulysses import ulysses_attention

__all__ = ["Layout", "RingAttention", "even_bounds", "gathered_attention", "ring_attention",
           "ulysses_attention"]
