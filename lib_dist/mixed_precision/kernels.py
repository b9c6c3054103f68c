"""The same training runs on another of torch's CPU kernel paths, in a fresh process.

torch chooses its CPU kernels once, when it is loaded: vectorised for the best instruction set
the CPU has (AVX2, AVX-512, ...) or the portable "default" ones, as `ATEN_CPU_CAPABILITY` asks.
They compute the same operations with other vector widths, so other orders of sums and, in
bf16, other places where a partial result is rounded. Whether a bf16 run ends above or below
its fp32 twin can change with them; fp32's differences stay at its rounding, far smaller. To
show it, `final_losses_with_kernels` runs `train_in_precision` in a child process started with
the capability asked for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from ..models import GPTConfig

_CHILD = """
import json, sys
import torch
from lib_dist.data import CharTokenizer, build_corpus
from lib_dist.mixed_precision.experiments import train_in_precision
from lib_dist.models import GPTConfig
torch.set_num_threads(1)
ask = json.loads(sys.argv[1])
corpus = build_corpus()
tokens = CharTokenizer(corpus.text).encode(corpus.text)
config = GPTConfig(**ask["config"])
losses = {mode: train_in_precision(mode, tokens, config, steps=ask["steps"],
                                   seed=ask["seed"]).final() for mode in ask["modes"]}
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "losses": losses}))
"""


def final_losses_with_kernels(capability: str, modes: Sequence[str], config: GPTConfig,
                              steps: int, seed: int = 0) -> tuple[str, dict[str, float]]:
    """`train_in_precision(mode, corpus tokens, config, steps, seed=seed).final()` for each
    mode, computed in a process whose torch uses the `capability` kernels ("default",
    "avx2", "avx512", ...). Returns the capability torch reports there (a CPU without the
    one asked for falls back) and the losses by mode."""
    ask = {"config": dataclasses.asdict(config), "modes": list(modes), "steps": steps,
           "seed": seed}
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(ask)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the run with ATEN_CPU_CAPABILITY={capability} failed:\n"
                           f"{done.stderr[-2000:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["capability"], answer["losses"]
