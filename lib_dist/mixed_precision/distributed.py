"""Loss scaling across data-parallel ranks: every rank skips when any rank overflowed.

A rank that steps while another skips leaves the replicas different forever after, and their
scales different too. Two ways keep them together:

- reduce the gradients before unscaling them (module 04's `DataParallel` does, Horovod's
  `optimizer.synchronize()` before `scaler.unscale_` does): an inf on one rank becomes an inf
  in the sum on every rank, so every rank finds it;
- or, when each rank checks gradients the others do not see (ZeRO: each rank holds only its
  shard of the reduced gradient, `zero.py`), all-reduce the overflow flag itself: one number.

`DistributedLossScaler` does the second: a `LossScaler` whose finding is the sum over the ranks
of each rank's flag, so the decision, and from it the scale, is the same everywhere.
"""

from __future__ import annotations

from typing import Any

import torch

from ..comm import Communicator
from .scaler import LossScaler


class DistributedLossScaler(LossScaler):
    """A `LossScaler` whose overflow check is agreed by every rank of `comm`."""

    def __init__(self, comm: Communicator, **kwargs: Any):
        super().__init__(**kwargs)
        self.comm = comm

    def agree(self, found_inf: bool) -> bool:
        """Whether any rank found an inf or nan: the flags summed by one all-reduce."""
        flag = torch.tensor([1.0 if found_inf else 0.0], device=self.comm.device)
        return bool(self.comm.all_reduce(flag).item() > 0)
