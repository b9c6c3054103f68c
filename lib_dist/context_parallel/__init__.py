"""Context parallelism (module 10): one sequence split across ranks (`Layout`: contiguous or
zig-zag), attention computed exactly by passing keys and values around the ring
(`ring_attention`), or by all-gathering them (`gathered_attention`), the alternative it is
measured against."""

from .gathered import gathered_attention
from .layout import Layout, even_bounds
from .ring import RingAttention, ring_attention

__all__ = ["Layout", "RingAttention", "even_bounds", "gathered_attention", "ring_attention"]
