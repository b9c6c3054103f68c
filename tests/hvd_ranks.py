"""lib_dist.horovod on simulated ranks, for the tests of its negotiation and its sparse
all-reduce (test_horovod_negotiation.py, test_horovod_sparse.py)."""

from __future__ import annotations

import lib_dist.horovod as hvd
from lib_dist.comm import SimulatedWorld


def on_ranks(n: int, fn, *args):
    """`fn(rank, *args)` on n simulated ranks, each with lib_dist.horovod initialized."""
    def body(comm):
        hvd.init(comm=comm)
        try:
            return fn(comm.rank, *args)
        finally:
            hvd.shutdown()
    return SimulatedWorld(n, timeout=30).run(body)


def failure(call) -> str:
    """What `call()` raised, as "Type: message", or "no error"."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the test reads its type and message
        return f"{type(e).__name__}: {e}"
    return "no error"
