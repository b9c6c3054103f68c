"""What the capstone benchmark measures of the machine before it times a step, on the cluster's
ranks, all at once (as a 3D step runs them): the planner's `Machines` for this CPU.

- the matmul rate every rank gets while all compute at once (a (256 x 256) product), and the
  rate the tiny GPT's own forward and backward reach on one micro-batch, as a fraction of it
  (its MFU);
- gloo's point-to-point latency and bandwidth: pairs of ranks swapping messages of growing
  size, all pairs at once, a line fitted through the one-way times (alpha, beta);
- gloo's all-reduce in groups of 2, 4 and 8 ranks (every group at once), small and large,
  a line through them per group size: the planner's `Machines.all_reduce`.

Each is the mean over its repeats, not the median: a step pays every one of its many
messages and collectives, the slow ones (a rank not yet scheduled on the shared cores)
included.

Sent to the engines by value (cloudpickle), as `rounds.py` is.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SIZES = (8, 2 ** 12, 2 ** 15, 2 ** 18)  # bytes of the point-to-point messages
ALL_REDUCE_SIZES = (8, 2 ** 12, 2 ** 15, 2 ** 17)


def matmul_rate(repeats: int = 15, n: int = 256) -> float:
    """FLOP/s of an (n x n) @ (n x n) product on this rank, mean of `repeats` timed runs."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        times.append((time.perf_counter() - start) / 4)
    return 2 * n ** 3 / statistics.mean(times)


def model_rate(config: Any, micro_batch: int, repeats: int = 5) -> float:
    """Model FLOP/s of the whole GPT's forward and backward on one micro-batch, this rank."""
    import torch

    from lib_dist.pipeline import gpt_layers, next_token_loss
    from lib_dist.train.utilisation import flops_per_token

    model = torch.nn.Sequential(*gpt_layers(config, seed=0))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(config.vocab_size, (micro_batch, config.block_size), generator=g)
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        next_token_loss(model(x), x).backward()
        if r:
            times.append(time.perf_counter() - start)
    return flops_per_token(config) * x.numel() / statistics.mean(times)


def one_way_seconds(comm: Any, nbytes: int, repeats: int) -> float:
    """Mean one-way time of an `nbytes` message between this rank and its pair's other."""
    import torch
    import torch.distributed as dist

    peer = comm.rank ^ 1
    t = torch.zeros(max(1, nbytes // 4))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if comm.rank % 2 == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)
        times.append((time.perf_counter() - start) / 2)
    return statistics.mean(times)


def all_reduce_seconds(group: Any, repeats: int) -> dict[int, float]:
    """Mean seconds of an all-reduce over `group` of each of `ALL_REDUCE_SIZES`, the sizes in
    turn and each time a fresh tensor, as a step's gradients come (the same tensor
    all-reduced again and again, the ranks fall into step and each takes less)."""
    import torch
    import torch.distributed as dist

    times: dict[int, list[float]] = {nbytes: [] for nbytes in ALL_REDUCE_SIZES}
    for _ in range(repeats):
        for nbytes in ALL_REDUCE_SIZES:
            t = torch.zeros(max(1, nbytes // 4))
            start = time.perf_counter()
            dist.all_reduce(t, group=group)
            times[nbytes].append(time.perf_counter() - start)
    return {nbytes: statistics.mean(each) for nbytes, each in times.items()}


def fitted_line(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """(alpha, beta) of the least-squares line seconds = alpha + bytes / beta."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    slope = (sum((x - mx) * (y - my) for x, y in zip(sizes, seconds))
             / sum((x - mx) ** 2 for x in sizes))
    return max(my - slope * mx, 0.0), 1 / max(slope, 1e-15)


def all_reduce_groups(comm: Any) -> dict[int, Any]:
    """This rank's group of 2, 4 and 8 consecutive ranks (collective: every rank calls it)."""
    import torch.distributed as dist

    world, out = comm.world_size, {}
    for size in (2, 4, 8):
        if world % size == 0:
            groups = [dist.new_group(list(range(g, g + size))) for g in range(0, world, size)]
            out[size] = groups[comm.rank // size]
    return out


def calibrate(comm: Any, config: Any, micro_batch: int, repeats: int,
              groups: dict[int, Any]) -> dict[str, Any]:
    """On every rank at once: its matmul and model rates, the pairs' one-way times by size,
    and all-reduce times in `groups` (`all_reduce_groups`; every rank must call it)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    out: dict[str, Any] = {"matmul": [], "model": []}
    dist.barrier()
    for _ in range(3):  # in turns, so that both see the machine's same moments
        out["matmul"].append(matmul_rate(repeats=5))
        out["model"].append(model_rate(config, micro_batch, repeats=2))
    out["matmul"], out["model"] = (statistics.mean(out[k]) for k in ("matmul", "model"))
    out["p2p"] = {}
    for nbytes in SIZES:
        dist.barrier()
        one_way_seconds(comm, nbytes, 2)
        out["p2p"][nbytes] = one_way_seconds(comm, nbytes, repeats)
    out["all_reduce"] = {}
    for size, mine in groups.items():
        dist.barrier()
        all_reduce_seconds(mine, 1)
        for nbytes, seconds in all_reduce_seconds(mine, repeats).items():
            out["all_reduce"][f"{size}/{nbytes}"] = seconds
    return out


def summary(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' calibrations as the planner takes them: median rates over ranks, the slowest
    pair's one-way times fitted to a line, the slowest group's all-reduce times and their line
    by group size."""
    matmul = statistics.median(r["matmul"] for r in per_rank)
    model = statistics.median(r["model"] for r in per_rank)
    sizes = sorted(int(s) for s in per_rank[0]["p2p"])
    seconds = [max(r["p2p"][s] for r in per_rank) for s in sizes]
    alpha, beta = fitted_line(sizes, seconds)
    all_reduce = {k: max(r["all_reduce"][k] for r in per_rank) for k in per_rank[0]["all_reduce"]}
    lines = {}
    for n in sorted({int(k.split("/")[0]) for k in all_reduce}):
        points = sorted((int(k.split("/")[1]), v) for k, v in all_reduce.items()
                        if k.startswith(f"{n}/"))
        lines[n] = fitted_line([b for b, _ in points], [t for _, t in points])
    return {"matmul_flops": matmul, "model_flops": model, "mfu": model / matmul,
            "alpha": alpha, "beta": beta, "p2p": dict(zip(sizes, seconds)),
            "all_reduce": all_reduce, "all_reduce_lines": lines}
