"""What expert parallelism's exchanges moved, read back from the ranks' trace.

A communicator records each `all_to_all` as one event whose bytes are what that rank sent,
its piece for itself included (`lib_dist.comm.trace`), on the simulated world and on real
ranks alike. An `ExpertParallelMoE` runs its all-to-alls in pairs: forward, dispatch (a rank
sends its tokens' rows) then combine (a rank sends back its experts' outputs); backward,
combine's reverse (a rank sends its tokens' gradients) then dispatch's reverse (a rank sends
back its experts' input gradients). So the second of every pair carries exactly the rows this
rank's experts processed: its bytes over the bytes of a row are the rank's **load**, and a
router that favours a few experts shows as ranks with far more rows than the others, which
everyone waits for.
"""

from __future__ import annotations

import torch

from ..comm import Trace


def all_to_all_bytes(trace: Trace) -> list[list[int]]:
    """The bytes each rank sent in each `all_to_all`: row i is the ranks' i-th all_to_all
    (every rank runs them in the same order), entry r rank r's bytes."""
    ranks = sorted({e.rank for e in trace.events})
    sent = [[e.nbytes for e in trace.of_rank(r) if e.kind == "all_to_all"] for r in ranks]
    if len({len(s) for s in sent}) > 1:
        raise ValueError("the ranks' traces hold different numbers of all_to_all ("
                         + ", ".join(f"rank {r}: {len(s)}" for r, s in zip(ranks, sent))
                         + "): is one rank's trace missing or cleared?")
    return [list(row) for row in zip(*sent)]


def expert_load(trace: Trace, n_embd: int, dtype: torch.dtype) -> list[list[int]]:
    """The rows each rank's experts processed, one row per forward and one per backward
    (equal), from the second all_to_all of each pair: bytes / (n_embd * itemsize)."""
    exchanges = all_to_all_bytes(trace)
    if len(exchanges) % 2:
        raise ValueError(f"the trace holds {len(exchanges)} all_to_all per rank, not pairs: "
                         f"is it only expert parallelism's, whole forwards and backwards?")
    row = n_embd * dtype.itemsize
    return [[b // row for b in exchange] for exchange in exchanges[1::2]]


def imbalance(load: list[int]) -> float:
    """The busiest rank's load over the mean: 1 when balanced; the layer runs this many times
    slower than it would balanced, since every rank waits for the busiest."""
    mean = sum(load) / len(load)
    return max(load) / mean if mean else 1.0
