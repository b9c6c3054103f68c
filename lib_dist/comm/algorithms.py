"""All-reduce algorithms built from point-to-point messages, and what each costs.

Every algorithm sums a flat, contiguous tensor over all ranks, in place, with nothing but
`isend`, `irecv` and `wait()` on `comm`: any `PointToPoint` (`rank`, `world_size`, messages).
That is a `Communicator` (its messages are traced, so tests and notebooks can count them), or
the torch backend's untraced lane inside `TorchCommunicator.all_reduce`. Every rank
ends with the same bits: each element's sum is computed once, or by partners adding the same
two values (addition is commutative), never in a rank-dependent order.

| algorithm | messages per rank | bytes sent per rank | good for |
| --- | --- | --- | --- |
| `ring` | 2(N-1) | 2(N-1)/N * n | large messages: bandwidth-optimal |
| `halving_doubling` | 2 log2 N | 2(N-1)/N * n | bandwidth-optimal in fewer steps |
| `recursive_doubling` | log2 N | n log2 N | small messages: fewest steps |
| `gather_broadcast` | rank 0: 2(N-1) | rank 0: (N-1) n | a few ranks, tiny messages |

(N a power of two; otherwise the two recursive algorithms first fold the extra ranks into
partners, which costs two more messages of n bytes.) `cost(N, nbytes, model)` prices each
under the alpha-beta model exactly as `Trace.modeled_time` prices its traced run (when the
chunks split evenly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .point_to_point import PointToPoint, chunk_bounds, wait_all
from .trace import AlphaBeta

StepHook = Callable[[int], None]


@dataclass(frozen=True)
class Algorithm:
    """An all-reduce: `run(comm, flat)` sums `flat` in place; `steps(N)` is the number of
    rounds of messages on the critical path and `sent(N, nbytes)` the bytes one rank pushes
    through its link on that path, so that `cost = steps * alpha + sent / beta`."""

    name: str
    run: Callable[[PointToPoint, torch.Tensor], None] | None  # None: a backend's own ("native")
    steps: Callable[[int], int]
    sent: Callable[[int, int], float]

    def cost(self, world_size: int, nbytes: int, model: AlphaBeta = AlphaBeta()) -> float:
        """Seconds under the alpha-beta model (0 for a single rank)."""
        if world_size == 1:
            return 0.0
        return self.steps(world_size) * model.alpha + self.sent(world_size, nbytes) / model.beta


# -- the algorithms ----------------------------------------------------------------------------


def ring(comm: PointToPoint, flat: torch.Tensor, on_step: StepHook | None = None) -> None:
    """Reduce-scatter then all-gather around the ring rank -> rank + 1, one chunk per step.

    In reduce-scatter step s (s = 0..N-2) rank r sends its partial sum of chunk r - s - 1
    (mod N) to the right and adds the one of chunk r - s - 2 arriving from the left, so after
    N-1 steps it holds the full sum of chunk r, the chunk `reduce_scatter` gives it. The
    all-gather then passes the finished chunks on: in step s rank r sends chunk r - s and
    receives chunk r - s - 1. Chunks follow `chunk_bounds`; empty ones (fewer elements than
    ranks) are not sent. `on_step(k)` is called after each of the 2(N-1) steps (for
    pictures of the algorithm)."""
    r, n = comm.rank, comm.world_size
    right, left = (r + 1) % n, (r - 1) % n
    chunks = [flat[lo:hi] for lo, hi in chunk_bounds(flat.numel(), n)]
    scratch = torch.empty_like(chunks[0])
    for s in range(n - 1):
        mine, theirs = chunks[(r - s - 1) % n], chunks[(r - s - 2) % n]
        buf = scratch[: theirs.numel()]
        _exchange(comm, mine, right, buf, left)
        theirs += buf
        if on_step:
            on_step(s)
    for s in range(n - 1):
        _exchange(comm, chunks[(r - s) % n], right, chunks[(r - s - 1) % n], left)
        if on_step:
            on_step(n - 1 + s)


def gather_broadcast(comm: PointToPoint, flat: torch.Tensor) -> None:
    """Parameter-server style: every rank sends its tensor to rank 0, which adds them up and
    sends the total back to each. Rank 0's link carries (N-1) n bytes each way."""
    others = range(1, comm.world_size)
    if not flat.numel():
        return
    if comm.rank == 0:
        bufs = [torch.empty_like(flat) for _ in others]
        wait_all([comm.irecv(b, src) for b, src in zip(bufs, others)])
        for b in bufs:
            flat += b
        wait_all([comm.isend(flat, dst) for dst in others])
    else:
        wait_all([comm.isend(flat, 0)])
        wait_all([comm.irecv(flat, 0)])


def recursive_doubling(comm: PointToPoint, flat: torch.Tensor) -> None:
    """log2 N rounds; in round k rank r swaps its whole partial sum with rank r XOR 2^k and
    adds. Fewest rounds, but n bytes each round."""
    def rounds(group: list[int], me: int) -> None:
        buf = torch.empty_like(flat)
        d = 1
        while d < len(group):
            partner = group[me ^ d]
            _exchange(comm, flat, partner, buf, partner)
            flat.add_(buf)
            d *= 2

    _with_power_of_two(comm, flat, rounds)


def halving_doubling(comm: PointToPoint, flat: torch.Tensor) -> None:
    """Rabenseifner's algorithm: reduce-scatter by recursive halving (each round, partners
    split their common range in two, each keeps one half and sends the other), then
    all-gather by recursive doubling (the same rounds backwards). 2 log2 N rounds and, like
    the ring, 2(N-1)/N * n bytes per rank."""
    def rounds(group: list[int], me: int) -> None:
        buf = torch.empty_like(flat)
        lo, hi, d = 0, flat.numel(), len(group) // 2
        history = []
        while d >= 1:  # reduce-scatter: halve the range each round
            partner, mid = group[me ^ d], (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if me & d == 0 else ((mid, hi), (lo, mid))
            part = buf[: keep[1] - keep[0]]
            _exchange(comm, flat[give[0]:give[1]], partner, part, partner)
            flat[keep[0]:keep[1]] += part
            history.append((partner, keep, give))
            (lo, hi), d = keep, d // 2
        for partner, keep, give in reversed(history):  # all-gather: the rounds backwards
            _exchange(comm, flat[keep[0]:keep[1]], partner, flat[give[0]:give[1]], partner)

    _with_power_of_two(comm, flat, rounds)


# -- helpers -----------------------------------------------------------------------------------


def _exchange(comm: PointToPoint, out: torch.Tensor, dst: int, into: torch.Tensor, src: int) -> None:
    """Send `out` to dst while receiving `into` from src; empty tensors are not sent."""
    handles = [comm.irecv(into, src)] if into.numel() else []
    if out.numel():
        handles.append(comm.isend(out, dst))
    wait_all(handles)


def _with_power_of_two(comm: PointToPoint, flat: torch.Tensor,
                       rounds: Callable[[list[int], int], None]) -> None:
    """Run `rounds(group, index in group)` on the largest power of two of ranks, 0..P-1.
    Each rank P + i first folds its tensor into rank i and gets the result back at the end."""
    n, r = comm.world_size, comm.rank
    p = 1 << _log2_floor(n)
    if not flat.numel():
        return
    if r >= p:  # an extra rank: hand the tensor to its partner, wait for the total
        wait_all([comm.isend(flat, r - p)])
        wait_all([comm.irecv(flat, r - p)])
        return
    extra = r + p < n
    if extra:
        buf = torch.empty_like(flat)
        wait_all([comm.irecv(buf, r + p)])
        flat += buf
    rounds(list(range(p)), r)
    if extra:
        wait_all([comm.isend(flat, r + p)])


def _log2_floor(n: int) -> int:
    return n.bit_length() - 1


def _folds(n: int) -> int:
    """Extra rounds of n bytes when N is not a power of two (fold in, hand back)."""
    return 0 if n & (n - 1) == 0 else 2


RING = Algorithm("ring", ring, steps=lambda n: 2 * (n - 1),
                 sent=lambda n, b: 2 * (n - 1) * b / n)
GATHER_BROADCAST = Algorithm("gather_broadcast", gather_broadcast,
                             steps=lambda n: 2 * (n - 1), sent=lambda n, b: 2 * (n - 1) * b)
RECURSIVE_DOUBLING = Algorithm(
    "recursive_doubling", recursive_doubling,
    steps=lambda n: _log2_floor(n) + _folds(n),
    sent=lambda n, b: (_log2_floor(n) + _folds(n)) * b)
HALVING_DOUBLING = Algorithm(
    "halving_doubling", halving_doubling,
    steps=lambda n: 2 * _log2_floor(n) + _folds(n),
    sent=lambda n, b: (2 * (1 - 1 / (1 << _log2_floor(n))) + _folds(n)) * b)

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    RING, HALVING_DOUBLING, RECURSIVE_DOUBLING, GATHER_BROADCAST)}
