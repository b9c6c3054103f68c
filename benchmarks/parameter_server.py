"""Parameter servers on 4 CPU ranks: a synchronous step against module 04's ring all-reduce,
asynchronous updates against synchronous ones, convergence against wall time, and where the
server's link saturates.

Module 02's tiny GPT (context 64, 2 layers, 4 heads, width 64: 0.1 M parameters), SGD, batches
of `--batch` windows of the corpus per worker, on a 4-rank lib_dist `Cluster` (gloo), one torch
thread per rank:

- DP, ring all-reduce: all 4 ranks are workers; the flattened gradients averaged by
  `lib_dist.comm.algorithms.ring` (module 03's, as module 04 teaches it); the baseline.
  "DP again", the same once more: its ratio to the baseline is the noise;
- PS 1 + 3 and PS 2 + 2: `lib_dist.parameter_server.parameter_server`, synchronous, with 1
  server and 3 workers, and 2 servers (shards) and 2 workers;
- PS 1 + 3 async: the same server applying each gradient as it arrives (first come).

Each variant runs `--steps` steps per call (one pull more than steps: the final one), in
interleaved rounds (benchmarks/rounds.py); the slowest rank's time, median over rounds, and the
ratio to the baseline in the same round. Throughput: tokens of gradients computed per second,
and parameter updates per second (a synchronous step is one update of W gradients; the
asynchronous server makes one update per gradient). Then convergence: the validation loss of
the server's parameters after 10, 20 and 40 steps per worker, synchronous and asynchronous,
against the wall time the job took (plot: out/parameter_server.png). Last, the link:
benchmarks/ps_link.py.

    python benchmarks/parameter_server.py [--rounds 7] [--steps 5] [--batch 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lib_dist.cluster import Cluster
from lib_dist.data import TokenBatches
from lib_dist.models import GPTConfig
from lib_dist.parameter_server.server import Mode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ps_link import link_table  # noqa: E402
from rounds import interleaved, median_ratio  # noqa: E402
from tiny_gpt import tiny_gpt  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
CONTEXT, LR = 64, 0.2
VARIANTS = ("DP, ring all-reduce", "DP again", "PS 1 + 3", "PS 2 + 2", "PS 1 + 3 async")


def next_token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def ps_measure(comm: Any, config: GPTConfig, batches: list, rounds: int, steps: int) -> dict:
    """This rank's seconds per call of each variant, by round."""
    import torch

    from lib_dist.comm.algorithms import ring
    from lib_dist.models import GPT
    from lib_dist.parameter_server import flat_gradients, flat_parameters, load_flat
    from lib_dist.parameter_server import parameter_server

    torch.set_num_threads(1)
    torch.manual_seed(0)
    initial = GPT(config)

    def batch_fn(worker: int, step: int):
        return batches[worker][step % len(batches[worker])]

    def data_parallel():
        model = GPT(config)
        model.load_state_dict(initial.state_dict())
        for step in range(steps):
            model.zero_grad()
            x, y = batch_fn(comm.rank, step)
            next_token_loss(model(x), y).backward()
            grad = flat_gradients(model)
            ring(comm, grad)
            load_flat(model, flat_parameters(model) - LR / comm.world_size * grad)

    def ps(servers: int, mode: Mode):
        return lambda: parameter_server(comm, initial, servers, steps, LR, batch_fn,
                                        next_token_loss, mode=mode)

    calls = {"DP, ring all-reduce": data_parallel, "DP again": data_parallel,
             "PS 1 + 3": ps(1, "sync"), "PS 2 + 2": ps(2, "sync"),
             "PS 1 + 3 async": ps(1, "async")}
    for call in calls.values():  # warm-up
        call()
    seconds, _ = interleaved(comm, calls, rounds)
    return seconds


def convergence(comm: Any, config: GPTConfig, batches: list, val: tuple, steps: int,
                mode: Mode) -> tuple[float, float]:
    """(seconds the job took, validation loss of the server's parameters) after `steps`
    steps per worker, 1 server and 3 workers."""
    import torch

    from lib_dist.models import GPT
    from lib_dist.parameter_server import load_flat, parameter_server

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(config)
    comm.barrier()
    start = time.perf_counter()
    result = parameter_server(comm, model, 1, steps, LR, lambda w, s: batches[w][s],
                              next_token_loss, mode=mode)
    seconds = time.perf_counter() - start
    if comm.rank != 0:
        return seconds, float("nan")
    load_flat(model, result.parameters)
    with torch.no_grad():
        return seconds, next_token_loss(model(val[0]), val[1]).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="steps per call")
    parser.add_argument("--batch", type=int, default=8, help="windows of 64 tokens per worker")
    parser.add_argument("--link-rounds", type=int, default=9)
    parser.add_argument("--link-sizes", type=int, nargs=2, default=[2**20, 8 * 2**20])
    args = parser.parse_args()
    start = time.perf_counter()
    config, train_ids, val_ids = tiny_gpt(CONTEXT)
    streams = [TokenBatches(train_ids, block_size=CONTEXT, batch_size=args.batch, seed=1 + r)
               for r in range(4)]
    batches = [[next(s) for _ in range(40)] for s in streams]
    val = next(TokenBatches(val_ids, block_size=CONTEXT, batch_size=64, seed=0))
    tokens = args.batch * CONTEXT
    lines = [f"one step: the slowest rank's, median over {args.rounds} rounds of calls of "
             f"{args.steps} steps; ratio: to DP, ring all-reduce, in the same round",
             f"{'variant':>20} {'workers':>7} {'ms/step':>8} {'ratio':>6} {'tokens/s':>9} "
             f"{'updates/s':>10}"]
    with Cluster(4, timeout=300) as cluster:
        per_rank = cluster.run(ps_measure, config, batches, args.rounds, args.steps,
                               timeout=900)
        slowest = {v: [max(ts) / args.steps for ts in zip(*(r[v] for r in per_rank))]
                   for v in VARIANTS}
        for v in VARIANTS:
            workers = {"PS 1 + 3": 3, "PS 2 + 2": 2, "PS 1 + 3 async": 3}.get(v, 4)
            step = statistics.median(slowest[v])
            updates = (workers if "async" in v else 1) / step
            lines.append(f"{v:>20} {workers:7d} {step * 1e3:8.1f} "
                         f"{median_ratio(slowest, v, VARIANTS[0]):6.2f} "
                         f"{workers * tokens / step:9.0f} {updates:10.1f}")
        print("\n".join(lines), flush=True)
        curves: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
        for steps in (10, 20, 40):
            for mode in curves:
                out = cluster.run(convergence, config, batches, val, steps, mode, timeout=600)
                curves[mode].append((max(s for s, _ in out), out[0][1]))
        lines += ["", "convergence, 1 server + 3 workers: (seconds, validation loss) after 10, "
                  "20 and 40 steps per worker"]
        lines += [f"{mode:>6}: " + ", ".join(f"({s:.2f} s, {loss:.3f})" for s, loss in c)
                  for mode, c in curves.items()]
        print("\n".join(lines[-3:]), flush=True)
        link_lines, link = link_table(cluster, args.link_sizes, args.link_rounds)
    lines += [""] + link_lines
    print("\n".join(link_lines), flush=True)
    lines.append(f"{time.perf_counter() - start:.0f} s in all on {os.cpu_count()} cores; load "
                 f"average now {os.getloadavg()[0]:.2f}")
    print(lines[-1])
    OUT.mkdir(exist_ok=True)
    plot(curves, OUT / "parameter_server.png")
    (OUT / "parameter_server.txt").write_text("\n".join(lines) + "\n")
    (OUT / "parameter_server.json").write_text(json.dumps(
        {"args": vars(args), "steps": slowest, "curves": curves, "link": link}, default=str))


def plot(curves: dict[str, list[tuple[float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for mode, points in curves.items():
        ax.plot(*zip(*points), marker="o", label=f"{mode}hronous, 1 server + 3 workers")
    ax.set(xlabel="wall time of the job (s)", ylabel="validation loss",
           title="parameter server on 4 CPU ranks: 10, 20, 40 steps per worker")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
