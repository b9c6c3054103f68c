"""Horovod's own synthetic benchmark on lib_dist.horovod, against the same program on torch's
DistributedDataParallel: images/s at 1, 2 and 4 ranks, and their ratio, in one run.

Horovod's script (`examples/pytorch/pytorch_synthetic_benchmark.py`) is Horovod's code and is
not kept here: give the path of a Horovod checkout (`git clone
https://github.com/horovod/horovod`). This script copies the example with two edits, and
nothing else changed: `import horovod.torch as hvd` becomes `import lib_dist.horovod as hvd`,
and `from torchvision import models` becomes a `models` namespace holding one small CNN,
`cpu_cnn` (torchvision does not import against the CPU torch wheel here, and ResNet-50 would
take minutes a step on a small CPU). The DDP program is the example's loop restated in its own
words below: the same fake batch, model, SGD (lr 0.01 x ranks), warm-up and timed iterations,
with `DistributedDataParallel` (which broadcasts rank 0's parameters when it is made) in place
of `hvd.DistributedOptimizer` and `hvd.broadcast_parameters`. Both run under the same
launcher, `python -m lib_dist.run -np N`, whose ranks are processes of one gloo group, in
interleaved rounds (lib_dist, DDP, then DDP, lib_dist, ...); the figures are each program's
median over the rounds of the example's own "Total img/sec", and the median of the rounds'
ratios. Each rank uses torch's default number of threads (the machine's cores): on a machine
with fewer cores than ranks, the ranks share them, as they would under horovodrun.

    python benchmarks/horovod_synthetic.py --horovod ~/src/horovod [--ranks 1 2 4] [--rounds 3]

Without a checkout (`--horovod`, or the environment variable HOROVOD_SRC) it says so and
exits 0 (`make bench` runs every script here). Writes `out/horovod_synthetic.txt` and `.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "out"
EXAMPLE = Path("examples/pytorch/pytorch_synthetic_benchmark.py")

MODELS = '''\
import types  # lib_dist: torchvision does not import here; a small CNN in its place
models = types.SimpleNamespace(cpu_cnn=lambda: torch.nn.Sequential(
    torch.nn.Conv2d(3, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
    torch.nn.Conv2d(64, 128, 3, stride=2, padding=1), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 1000)))
'''
EDITS = {"import horovod.torch as hvd\n": "import lib_dist.horovod as hvd\n",
         "from torchvision import models\n": MODELS}

DDP_PROGRAM = '''\
"""Horovod's synthetic benchmark, restated on torch.distributed + DistributedDataParallel."""
import argparse
import timeit

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

{models}
parser = argparse.ArgumentParser()
parser.add_argument("--model", default="cpu_cnn")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--num-warmup-batches", type=int, default=10)
parser.add_argument("--num-batches-per-iter", type=int, default=10)
parser.add_argument("--num-iters", type=int, default=10)
args = parser.parse_args()
if not dist.is_initialized():  # under torchrun; lib_dist.run's ranks have joined a group
    dist.init_process_group("gloo")
size, rank = dist.get_world_size(), dist.get_rank()
model = DistributedDataParallel(getattr(models, args.model)())  # rank 0's parameters
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
data = torch.randn(args.batch_size, 3, 224, 224)
target = torch.LongTensor(args.batch_size).random_() % 1000


def benchmark_step():
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()  # DDP averages the gradients
    optimizer.step()


timeit.timeit(benchmark_step, number=args.num_warmup_batches)
img_secs = [args.batch_size * args.num_batches_per_iter
            / timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
            for _ in range(args.num_iters)]
if rank == 0:
    print("Total img/sec on %d CPU(s): %.1f +-%.1f"
          % (size, size * np.mean(img_secs), size * 1.96 * np.std(img_secs)))
'''
TOTAL = re.compile(r"Total img/sec on (\d+) CPU\(s\): ([\d.]+) \+-([\d.]+)")


def horovod_program(checkout: Path) -> str:
    """Horovod's example with the import and the model edited (an error if either edit no
    longer applies: the checkout's example has changed)."""
    source = (checkout / EXAMPLE).read_text()
    for old, new in EDITS.items():
        if source.count(old) != 1:
            raise SystemExit(f"{checkout / EXAMPLE}: expected the line {old.strip()!r} once; "
                             f"this Horovod checkout's example differs from the one this "
                             f"script edits")
        source = source.replace(old, new)
    return source


def images_per_second(program: Path, ranks: int, settings: list[str], timeout: float) -> float:
    """The program's "Total img/sec" on `ranks` ranks of lib_dist's launcher."""
    command = [sys.executable, "-m", "lib_dist.run", "-np", str(ranks), "--timeout",
               str(timeout), str(program), "--model", "cpu_cnn", *settings]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout + 120)
    found = TOTAL.search(done.stdout)
    if done.returncode != 0 or found is None or int(found.group(1)) != ranks:
        raise SystemExit(f"{program.name} on {ranks} ranks failed (exit {done.returncode}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return float(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horovod", type=Path, default=os.environ.get("HOROVOD_SRC"),
                        help="a Horovod checkout (default: $HOROVOD_SRC)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3, help="warm-up batches")
    parser.add_argument("--batches", type=int, default=5, help="batches per timed iteration")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    args = parser.parse_args()
    if args.horovod is None or not (args.horovod / EXAMPLE).is_file():
        print(f"horovod_synthetic: skipped, no Horovod checkout (give --horovod PATH or set "
              f"HOROVOD_SRC to a clone of https://github.com/horovod/horovod holding {EXAMPLE})")
        return
    settings = ["--batch-size", str(args.batch_size), "--num-warmup-batches", str(args.warmup),
                "--num-batches-per-iter", str(args.batches), "--num-iters", str(args.iters)]
    scratch = Path(tempfile.mkdtemp(prefix="horovod_synthetic_"))
    programs = {"lib_dist.horovod": scratch / "pytorch_synthetic_benchmark.py",
                "torch DDP": scratch / "ddp_synthetic_benchmark.py"}
    programs["lib_dist.horovod"].write_text(horovod_program(args.horovod))
    programs["torch DDP"].write_text(DDP_PROGRAM.format(models=MODELS))
    lines = [f"Horovod's pytorch_synthetic_benchmark.py (model cpu_cnn, batch {args.batch_size} "
             f"per rank, {args.iters} x {args.batches} timed batches) on {os.cpu_count()} CPU "
             f"cores, {torch.get_num_threads()} torch threads a rank; torch {torch.__version__}",
             f"{'ranks':>5}  {'lib_dist img/s':>14}  {'DDP img/s':>9}  {'lib_dist/DDP':>12}  "
             f"rounds (lib_dist, DDP)"]
    print("\n".join(lines), flush=True)
    results = []
    for n in args.ranks:
        rounds = []
        for k in range(args.rounds):
            order = list(programs) if k % 2 == 0 else list(reversed(programs))
            got = {what: images_per_second(programs[what], n, settings, args.timeout)
                   for what in order}
            rounds.append((got["lib_dist.horovod"], got["torch DDP"]))
        ours = statistics.median(r[0] for r in rounds)
        ddp = statistics.median(r[1] for r in rounds)
        ratio = statistics.median(r[0] / r[1] for r in rounds)
        results.append(dict(ranks=n, lib_dist=ours, ddp=ddp, ratio=ratio, rounds=rounds))
        shown = ", ".join(f"({a:.1f}, {b:.1f})" for a, b in rounds)
        lines.append(f"{n:>5}  {ours:>14.1f}  {ddp:>9.1f}  {ratio:>12.2f}  {shown}")
        print(lines[-1], flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "horovod_synthetic.txt").write_text("\n".join(lines) + "\n")
    (OUT / "horovod_synthetic.json").write_text(json.dumps(dict(
        when=time.strftime("%Y-%m-%d %H:%M"), cores=os.cpu_count(), batch_size=args.batch_size,
        iters=args.iters, batches=args.batches, results=results), indent=1))


if __name__ == "__main__":
    main()
