"""A virtual clock for the simulated world: timelines that are the same on every run.

Wall-clock timelines on a shared laptop are noise. With a clock, `SimulatedWorld(p,
clock=VirtualClock(...))` keeps a virtual time per rank, which moves only by what the program
declares:

- `comm.compute(label, cost)`: the rank works for `cost` units (e.g. a forward 1, a
  backward 2);
- a message of b bytes takes `message.cost(b)` units (alpha-beta; free by default). It leaves
  once both its send and its receive are posted, at the later of the two virtual times, and
  both sides see it complete when it arrives. A rank that waits for it moves its clock on to
  that moment, if that is later than its own. Links are not shared: two messages never delay
  each other, so every time depends on program order alone, never on the threads' speed;
- a barrier completes at the latest virtual time any rank entered it.

Every event in the trace then carries `vstart`/`vend`: a schedule's makespan, its idle time
and who waited for whom are exact numbers a test can assert and a figure can draw
(`lib_dist.comm.plot`). Virtual time follows the calls each rank makes in its own thread; an
`all_reduce_async` running on the rank's background thread is not priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .trace import AlphaBeta


@dataclass(frozen=True)
class VirtualClock:
    """The price list of virtual time. `message`: what a message costs, in the same units as
    the compute costs the program declares (default: messages are free)."""

    message: AlphaBeta = field(default_factory=lambda: AlphaBeta(alpha=0.0, beta=math.inf))

    def message_cost(self, nbytes: int) -> float:
        return self.message.cost(nbytes)
