"""What a synchronous step's communication costs, parameter server against ring all-reduce.

In the alpha-beta model a message of b bytes takes alpha + b / beta on a link. A model of M
bytes, W workers, s servers (each on its own link), N = W ranks in the ring:

- parameter server: every step each server receives W gradient shards of M / s bytes and sends
  W parameter shards of M / s. They all cross the server's one link, one after another:
  2 W (alpha + M / (s beta)). The server's link carries W times what a worker's does: it is the
  bottleneck, and s servers divide it by s.
- ring all-reduce: 2 (N - 1) messages of M / N per rank, on every link at once:
  2 (N - 1) (alpha + M / (N beta)), nearly 2 M / beta however many ranks there are.

`link_bytes` measures the same from a trace: the bytes each rank's link carried, both ways.
"""

from __future__ import annotations

from ..comm import AlphaBeta, Trace


def ps_step_time(model_bytes: float, workers: int, servers: int = 1,
                 network: AlphaBeta = AlphaBeta()) -> float:
    """Seconds of one synchronous parameter-server step's messages, at the busiest server."""
    return 2 * workers * network.cost(int(model_bytes / servers))


def ring_step_time(model_bytes: float, ranks: int, network: AlphaBeta = AlphaBeta()) -> float:
    """Seconds of one ring all-reduce of the gradient."""
    if ranks == 1:
        return 0.0
    return 2 * (ranks - 1) * network.cost(int(model_bytes / ranks))


def ps_link_bytes(model_bytes: float, workers: int, servers: int = 1) -> dict[str, float]:
    """Bytes a step puts on a server's link and on a worker's, both ways together."""
    return {"server": 2 * workers * model_bytes / servers, "worker": 2 * model_bytes}


def ring_link_bytes(model_bytes: float, ranks: int) -> float:
    """Bytes a ring all-reduce step puts on each rank's link, both ways together."""
    return 2 * 2 * (ranks - 1) / ranks * model_bytes


def link_bytes(trace: Trace) -> dict[int, int]:
    """Bytes sent plus bytes received, per rank, from a trace."""
    return {r: t.sent_bytes + t.recv_bytes for r, t in trace.summary().items()}
