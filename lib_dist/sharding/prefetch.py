"""Prefetching: the all-gather of the unit that computes next runs while this one computes.

Without it a rank alternates: gather unit k (the links busy, the rank waiting), compute unit k
(the rank busy, the links idle), gather unit k + 1... With `FSDP(..., prefetch=True)`:

- forward: once unit k is gathered, unit k + 1's all-gather starts (`all_gather_async`, on the
  rank's background thread) and travels while unit k computes;
- backward, which meets the units in reverse: once unit k is gathered again, unit k - 1's
  all-gather starts. Before unit k's gradient is reduce-scattered, that gather is waited for:
  a rank starts nothing else on its communicator while an asynchronous operation is in flight
  (`lib_dist.comm.background`), and every rank must issue the same collectives in one order.

The price: two units gathered at once, so the peak grows by about one unit's parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .fsdp import Unit


class Prefetcher:
    """At most one unit's all-gather in flight, then the full flat vector it brought, until
    that unit takes it."""

    def __init__(self) -> None:
        self.unit: Unit | None = None
        self.handle: Any = None  # the BackgroundHandle of the all-gather in flight
        self.flat: torch.Tensor | None = None

    def start(self, unit: Unit) -> None:
        """Start gathering `unit` (anything fetched before and not taken is dropped)."""
        self.settle()
        self.unit, self.flat = unit, None
        self.handle = unit.comm.all_gather_async(unit.shard.detach().contiguous())

    def settle(self) -> None:
        """Wait for the gather in flight, if any: the communicator is free again."""
        if self.handle is not None:
            handle, self.handle = self.handle, None
            handle.wait()
            self.flat = torch.cat(handle.result)

    def take(self, unit: Unit) -> torch.Tensor | None:
        """`unit`'s prefetched flat vector (waiting for it to arrive); None if it was not
        the unit prefetched."""
        if self.unit is not unit:
            return None
        self.settle()
        flat, self.unit, self.flat = self.flat, None, None
        return flat

    def clear(self) -> None:
        """Forget what was fetched and not used (a new step: the shards may have changed)."""
        self.settle()
        self.unit, self.flat = None, None


__all__ = ["Prefetcher"]
