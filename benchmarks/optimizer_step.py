"""Time per optimizer step: the course's optimizers (lab 2's instructor solution, loaded from
solutions/ with `lib_dist.extend.definitions`) against torch.optim's, on the tiny GPT's
parameters, in the same process. Prints microseconds per step and the ratio to torch's.

The course's optimizers update one parameter at a time in Python; torch's fuse the update over
all parameters (its "foreach" implementation). The ratio is the price of readability.

    python benchmarks/optimizer_step.py [--steps 200]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from lib_dist.extend import definitions
from lib_dist.models import GPT, GPTConfig

REPO = Path(__file__).resolve().parent.parent
LAB = REPO / "solutions" / "lab02_training" / "lab02_training.ipynb"


def seconds_per_step(make_optimizer, steps: int) -> float:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=64))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer = make_optimizer(model.parameters())
    for _ in range(5):  # warm up: state allocated
        optimizer.step()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    SGD, AdamW = definitions(LAB, "SGD", "AdamW")
    pairs = [
        ("SGD, momentum 0.9", lambda ps: SGD(ps, lr=0.1, momentum=0.9),
         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
        ("AdamW", lambda ps: AdamW(ps, lr=1e-3), lambda ps: torch.optim.AdamW(ps, lr=1e-3)),
    ]
    print(f"{'optimizer':<20}{'course (us)':>14}{'torch (us)':>14}{'ratio':>8}")
    for name, ours, theirs in pairs:
        mine, baseline = seconds_per_step(ours, args.steps), seconds_per_step(theirs, args.steps)
        print(f"{name:<20}{mine * 1e6:>14.1f}{baseline * 1e6:>14.1f}{mine / baseline:>8.2f}")


if __name__ == "__main__":
    main()
