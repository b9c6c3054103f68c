"""What Horovod has and lib_dist.horovod does not: each fails with a message naming it.

Process sets (subsets of ranks running their own collectives) exist only as
`global_process_set`, every rank, which every operation also takes explicitly. The other
names below are Horovod's operations that have no counterpart here; calling one raises
`NotImplementedError` naming it, so a Horovod program that needs them stops at the line that
uses them rather than somewhere later.
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn

from . import basics


class GlobalProcessSet:
    """Every rank: the only process set lib_dist.horovod has."""

    process_set_id = 0
    ranks = None

    def size(self) -> int:
        return basics.size()

    def rank(self) -> int:
        return basics.rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(all ranks)"


global_process_set = GlobalProcessSet()


def check_process_set(process_set: Any, what: str) -> None:
    """Refuse any process set but the global one."""
    if process_set is not None and not isinstance(process_set, GlobalProcessSet):
        raise NotImplementedError(f"lib_dist.horovod does not support process sets: {what} "
                                  f"runs on all ranks (leave process_set out)")


def _unsupported(name: str, hint: str) -> Callable[..., NoReturn]:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"lib_dist.horovod does not support {name}; {hint}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not supported: raises NotImplementedError ({hint})."
    return refuse


sparse_allreduce_async = _unsupported(
    "sparse_allreduce_async", "densify the gradient (DistributedOptimizer(sparse_as_dense=True))")
ProcessSet = _unsupported("ProcessSet", "every operation runs on all ranks")
add_process_set = _unsupported("add_process_set", "every operation runs on all ranks")
remove_process_set = _unsupported("remove_process_set", "every operation runs on all ranks")
SyncBatchNorm = _unsupported("SyncBatchNorm", "use torch.nn.SyncBatchNorm with a "
                             "torch.distributed group, or plain BatchNorm per rank")

NAMES = ["sparse_allreduce_async", "ProcessSet", "add_process_set", "remove_process_set",
         "SyncBatchNorm"]
