"""Where a parameter server's link saturates: the third part of benchmarks/parameter_server.py
(which runs it).

Messages only, no model: rank 0 is the server; in a round it sends M bytes to each of W
workers (their pull) and receives M bytes from each (their push), all posted at once, as
`lib_dist.parameter_server.serve` does. W = 1, 2, 3 of a 4-rank cluster (the other ranks
idle), for two sizes M. The alpha-beta model of `lib_dist.parameter_server.cost` says a round
costs 2 W (alpha + M / beta) at the server, every message crossing its one link in turn;
alpha and beta are fitted from W = 1 at the two sizes, and the rounds at W = 2, 3 are put
against the model's prediction. A ring all-reduce of the same M on all 4 ranks is measured
beside it, against 2 (N - 1) (alpha + M / (N beta)) with the same alpha and beta.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from lib_dist.comm import AlphaBeta


def link_rounds(comm: Any, sizes: list[int], workers: list[int], rounds: int) -> dict:
    """Seconds per server round for each (size, W), and per ring all-reduce for each size:
    the medians over `rounds`, measured on rank 0 between barriers."""
    from lib_dist.comm.algorithms import ring

    torch.set_num_threads(1)
    out: dict = {"ps": {}, "ring": {}}
    for nbytes in sizes:
        numel = nbytes // 4
        for w in workers:
            seconds = []
            for _ in range(rounds + 1):  # the first is a warm-up
                comm.barrier()
                start = time.perf_counter()
                if comm.rank == 0:
                    sends = [comm.isend(torch.ones(numel), r) for r in range(1, w + 1)]
                    received = [torch.empty(numel) for _ in range(w)]
                    recvs = [comm.irecv(b, r) for r, b in zip(range(1, w + 1), received)]
                    for h in sends + recvs:
                        h.wait()
                elif comm.rank <= w:
                    params = torch.empty(numel)
                    comm.recv(params, 0)
                    comm.send(params, 0)
                seconds.append(time.perf_counter() - start)
                comm.trace.clear()
            out["ps"][nbytes, w] = statistics.median(seconds[1:])
        seconds = []
        for _ in range(rounds + 1):
            flat = torch.ones(numel)
            comm.barrier()
            start = time.perf_counter()
            ring(comm, flat)
            seconds.append(time.perf_counter() - start)
            comm.trace.clear()
        out["ring"][nbytes] = statistics.median(seconds[1:])
    return out


def fit_alpha_beta(sizes: list[int], round_seconds: list[float]) -> AlphaBeta:
    """alpha and beta from two W = 1 rounds (2 messages each) of two sizes."""
    (m1, m2), (t1, t2) = sizes, (t / 2 for t in round_seconds)
    inverse_beta = (t2 - t1) / (m2 - m1)
    return AlphaBeta(alpha=max(t1 - m1 * inverse_beta, 0.0), beta=1 / inverse_beta)


def link_table(cluster: Any, sizes: list[int], rounds: int) -> tuple[list[str], dict]:
    from lib_dist.parameter_server import ps_step_time, ring_step_time

    measured = cluster.run(link_rounds, sizes, [1, 2, 3], rounds, timeout=600)[0]
    network = fit_alpha_beta(sizes, [measured["ps"][m, 1] for m in sizes])
    lines = [f"the server's link: rank 0 sends M bytes to each of W workers and receives M "
             f"from each (median of {rounds} rounds); alpha-beta fitted from W = 1: alpha "
             f"{network.alpha * 1e6:.0f} us, beta {network.beta / 1e9:.2f} GB/s",
             f"{'M':>8} {'W':>3} {'ms/round':>9} {'predicted':>10} {'measured/predicted':>19} "
             f"{'x W = 1':>8}"]
    for m in sizes:
        for w in (1, 2, 3):
            t, p = measured["ps"][m, w], ps_step_time(m, w, 1, network)
            lines.append(f"{m / 2**20:6.1f}MB {w:3d} {t * 1e3:9.2f} {p * 1e3:10.2f} "
                         f"{t / p:19.2f} {t / measured['ps'][m, 1]:8.2f}")
        ring, p = measured["ring"][m], ring_step_time(m, 4, network)
        lines.append(f"{m / 2**20:6.1f}MB   ring all-reduce on 4 ranks {ring * 1e3:9.2f} ms, "
                     f"predicted {p * 1e3:.2f} ms ({ring / p:.2f}x)")
    return lines, {"measured": {str(k): v for k, v in measured["ps"].items()},
                   "ring": measured["ring"], "alpha": network.alpha, "beta": network.beta}
