"""What Horovod has and lib_dist.horovod does not: each fails with a message naming it.

The names below are Horovod's operations that have no counterpart here; calling one raises
`NotImplementedError` naming it, so a Horovod program that needs them stops at the line that
uses them rather than somewhere later.
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn

from . import basics


def _unsupported(name: str, hint: str) -> Callable[..., NoReturn]:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"lib_dist.horovod does not support {name}; {hint}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not supported: raises NotImplementedError ({hint})."
    return refuse


SyncBatchNorm = _unsupported("SyncBatchNorm", "use torch.nn.SyncBatchNorm with a "
                             "torch.distributed group, or plain BatchNorm per rank")

NAMES = ["SyncBatchNorm"]
