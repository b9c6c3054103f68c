"""Pick an all-reduce algorithm by message size and world size, the way NCCL's tuner does.

NCCL prices each of its algorithms with a latency-bandwidth model (a base latency, a latency
per step, a bandwidth scaled by a per-algorithm efficiency) and runs the cheapest for every
call. `TunerModel` does the same for the algorithms of `lib_dist.comm.algorithms` and the
backend's own all-reduce, "native" (gloo's is a ring, so it is priced as one):

    T_a(N, n) = overhead_a + steps_a(N) * alpha + sent_a(N, n) / (beta * efficiency_a)

`calibrate` measures the numbers on the machine, with the group itself: `alpha` and `beta`
from messages between ranks 0 and 1, then `overhead_a` and `efficiency_a` by timing every
algorithm at a few sizes. What the alpha-beta formula leaves out (Python's cost per message,
gloo's worker thread, ranks sharing cores) lands in those two numbers. All ranks adopt the
slowest rank's timings, so they build the same model and choose the same algorithm for the
same tensor, as they must: ranks running different algorithms would deadlock.
`calibration` keeps the result, once per machine.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..algorithms import ALGORITHMS, RING, Algorithm, gather_broadcast
from ..base import PointToPoint
from ..trace import AlphaBeta

NATIVE = "native"
SHARED_MEMORY = "shared_memory"
# gloo's all-reduce is a ring (reduce-scatter then all-gather); price "native" as one. The
# shared-memory all-reduce (`all_reduce`) sends no message (its two
# barriers are its overhead) and copies each byte into and out of shared memory: 2n bytes.
SHAPES: dict[str, Algorithm] = {
    **ALGORITHMS,
    NATIVE: Algorithm(NATIVE, None, RING.steps, RING.sent),
    SHARED_MEMORY: Algorithm(SHARED_MEMORY, None, steps=lambda n: 0, sent=lambda n, b: 2 * b),
}
# what `calibrate` times unless told otherwise: shared memory is only there when the
# ranks share a host, and the caller knows whether they do
P2P_AND_NATIVE = (*ALGORITHMS, NATIVE)
CALIBRATION_SIZES = (4 << 10, 512 << 10, 16 << 20)  # bytes: latency-, mid- and bandwidth-bound
MARGIN = 0.75  # see TunerModel


@dataclass(frozen=True)
class Fit:
    """What one algorithm achieves on top of the alpha-beta model: a fixed cost per call, in
    seconds, and the fraction of `beta` its bytes move at."""

    overhead: float
    efficiency: float


@dataclass(frozen=True)
class TunerModel:
    """The cost of every candidate algorithm on one group, and the choice it implies.

    `margin`: a measured algorithm replaces "native" only if it is predicted to take at most
    `margin` of native's time. On a machine whose ranks share cores, timings of the same
    all-reduce scatter by 20% around their median at mid sizes; a prediction must beat
    native by more than that before noise cannot turn the trade into a loss.
    """

    world_size: int
    network: AlphaBeta
    fits: dict[str, Fit]
    margin: float = MARGIN
    timings: dict[str, dict[int, float]] = field(default_factory=dict, compare=False)

    def predict(self, name: str, nbytes: int) -> float:
        """Seconds one all-reduce of `nbytes` takes with algorithm `name`, per the model."""
        shape, fit = SHAPES[name], self.fits[name]
        n = self.world_size
        if n == 1:
            return 0.0
        return (fit.overhead + shape.steps(n) * self.network.alpha
                + shape.sent(n, nbytes) / (self.network.beta * fit.efficiency))

    def choose(self, nbytes: int) -> str:
        """The algorithm to run for a tensor of `nbytes` bytes."""
        times = {name: self.predict(name, nbytes) for name in self.fits}
        best = min(times, key=lambda name: times[name])
        if NATIVE in times and times[best] > self.margin * times[NATIVE]:
            return NATIVE
        return best

    def table(self, sizes: list[int]) -> list[dict[str, Any]]:
        """Per size: predicted seconds of every algorithm and the choice, for notebooks."""
        return [{"bytes": s, "choice": self.choose(s),
                 **{name: self.predict(name, s) for name in self.fits}} for s in sizes]


def native_only(world_size: int) -> TunerModel:
    """A model that always picks the backend's own all-reduce (NCCL, or a single rank)."""
    return TunerModel(world_size, AlphaBeta(), {NATIVE: Fit(0.0, 1.0)})


def calibrate(p2p: PointToPoint, run: Callable[[str, torch.Tensor], None],
              slowest: Callable[[torch.Tensor], torch.Tensor],
              candidates: tuple[str, ...] = P2P_AND_NATIVE,
              sizes: tuple[int, ...] = CALIBRATION_SIZES, margin: float = MARGIN,
              barrier: Callable[[], None] | None = None) -> TunerModel:
    """Measure alpha, beta and every candidate's fit on this group. Collective: every rank
    calls it with the same arguments.

    p2p: the rank's `isend`/`irecv` (and `rank`, `world_size`), for the ping-pong;
    run(name, flat): all-reduce `flat` in place with algorithm `name`;
    slowest(t): the element-wise maximum of `t` over all ranks (a MAX all-reduce);
    barrier(): where every timed call starts; the tighter the better, since a rank that
    leaves the barrier late makes the others wait and that wait is charged to the call
    (default: two short messages per rank through rank 0).
    """
    n = p2p.world_size
    network = _ping_pong(p2p, slowest)
    if barrier is None:
        token = torch.zeros(1)
        barrier = lambda: gather_broadcast(p2p, token)  # noqa: E731
    measured = torch.tensor([_times(p2p, run, candidates, size, barrier) for size in sizes],
                            dtype=torch.float64)
    measured = slowest(measured).T  # by candidate, then size
    timings = {name: dict(zip(sizes, row.tolist())) for name, row in zip(candidates, measured)}
    fits = {name: fit_line(name, n, network, timings[name]) for name in candidates}
    return TunerModel(n, network, fits, margin, timings)


def fit_line(name: str, world_size: int, network: AlphaBeta,
             timings: dict[int, float]) -> Fit:
    """Overhead and efficiency of `name` from its timings by size: a least-squares line in
    relative error through T - steps * alpha = overhead + (sent / beta) / efficiency."""
    shape = SHAPES[name]
    xs = [shape.sent(world_size, b) / network.beta for b in timings]
    ys = [t - shape.steps(world_size) * network.alpha for t in timings.values()]
    ws = [1.0 / max(t, 1e-9) ** 2 for t in timings.values()]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    my = sum(w * y for w, y in zip(ws, ys)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx if sxx else 1.0
    slope = min(max(slope, 1 / 8), 50.0)  # noise can tilt a line: keep 0.02 <= efficiency <= 8
    return Fit(overhead=my - slope * mx, efficiency=1.0 / slope)


def _ping_pong(p2p: PointToPoint, slowest: Callable[[torch.Tensor], torch.Tensor],
               small: int = 8, large: int = 4 << 20, reps: int = 5) -> AlphaBeta:
    """alpha: half a round trip of `small` bytes between ranks 0 and 1; beta: from the extra
    time `large` bytes take. Medians of `reps` round trips; other ranks wait."""
    seconds = torch.zeros(2, dtype=torch.float64)
    if p2p.rank < 2:
        peer = 1 - p2p.rank
        for i, nbytes in enumerate((small, large)):
            out, into = torch.zeros(nbytes // 4), torch.empty(nbytes // 4)
            _round_trip(p2p, peer, out, into)  # warm up the connection
            seconds[i] = _median_seconds(lambda: _round_trip(p2p, peer, out, into), reps) / 2
    alpha, big = slowest(seconds).tolist()
    # noise can make the large message look as fast as the small one: bound the estimate
    return AlphaBeta(alpha=alpha, beta=(large - small) / max(big - alpha, big / 2, 1e-9))


def _round_trip(p2p: PointToPoint, peer: int, out: torch.Tensor, into: torch.Tensor) -> None:
    if p2p.rank == 0:
        p2p.isend(out, peer).wait()
        p2p.irecv(into, peer).wait()
    else:
        p2p.irecv(into, peer).wait()
        p2p.isend(out, peer).wait()


def _times(p2p: PointToPoint, run: Callable[[str, torch.Tensor], None], candidates: tuple[str, ...],
           nbytes: int, barrier: Callable[[], None]) -> list[float]:
    """Median seconds per call of every candidate on `nbytes`. Calls are interleaved, so that
    a disturbance hits all candidates alike, and each starts from a barrier, so that none
    pays for the ranks its predecessor left behind. The number of calls depends only on the
    size and world size, the same on every rank, as it must be: every call is collective."""
    flat = torch.zeros(nbytes // 4)
    for name in candidates:  # warm up: connections, buffers
        run(name, flat)
    expected = 1e-3 + nbytes * p2p.world_size / 1e9  # a rough guess: milliseconds, GB/s
    reps = max(3, min(15, int(0.03 / expected)))
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(reps):
        for name in candidates:
            barrier()
            start = time.perf_counter()
            run(name, flat)
            times[name].append(time.perf_counter() - start)
    return [statistics.median(times[name]) for name in candidates]


def _median_seconds(fn: Callable[[], None], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
