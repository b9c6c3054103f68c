"""Mixed precision and ZeRO-1 on the CPU: step time and peak memory by precision, the loss
scalers' own cost, and the ZeRO-1 optimizer's state and step time against data parallel.

Module 02's tiny GPT (vocabulary 96 from `build_corpus` / `CharTokenizer`, context 64, 2
layers, 4 heads, width 64: 0.1 M parameters), trained with AdamW on `--batch` windows of the
corpus from `TokenBatches`, the loss a cross-entropy of `logits.float()`. One training step of:

- fp32: no autocast, the baseline;
- bf16 autocast: the forward under `torch.autocast("cpu", torch.bfloat16)`, no loss scaling;
- fp16 + GradScaler: under fp16 autocast, `torch.amp.GradScaler("cpu")`, the baseline of the
  loss scalers; "fp16 + GradScaler again", the same once more: its ratio to it is the noise;
- fp16 + LossScaler: the same with lib_dist's `LossScaler`.

Every model starts from the same initialisation; before any timing, the two fp16 variants are
checked to produce identical parameters and scales (the same decisions on the same gradients).
In every round each variant runs `--steps` steps, in an order shuffled per round, so that load
drifts fall on all alike; the table shows the median over rounds of the step time and of its
ratio to the baseline's in the same round. Peak memory is `lib_dist.train.measure_peak_memory`
(module 02's: every allocation of a step, under `torch.profiler`).

A CPU is not what half precision is for. It has no fp16 matrix units: fp16 autocast runs
several times slower than fp32 here, and its step time is noisy enough to swamp the scaler's
microseconds. So the scalers are also timed alone (benchmarks/scaler_rounds.py), `unscale_` +
`step` + `update` on the same scaled gradients (restored before every call, outside the
timing), for this GPT's 28 gradients and for the 52 and 292 of 4 and 24 layers, once with
AdamW and once with an optimizer whose step does nothing (the scaler's own work), as ratios to
GradScaler's in the same round; the difference on 28 is put against the step times. Whether
bf16 beats fp32 depends on the processor. This part runs on `--threads` threads (1 by default:
steadier beside other work). Where CUDA is available, the same on the GPU, and whole fp16
steps of a 4-layer GPT with each scaler (the goal: LossScaler's at most 1.05 times
GradScaler's). Then ZeRO-1 against data parallel on 2 and 4 ranks: benchmarks/zero_rounds.py.

    python benchmarks/mixed_precision.py [--rounds 7] [--steps 2] [--batch 32]
        [--threads 1] [--ranks 2 4] [--zero-rounds 9] [--zero-steps 3] [--zero-batch 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from lib_dist.data import TokenBatches
from lib_dist.mixed_precision import LossScaler
from lib_dist.models import GPT, GPTConfig
from lib_dist.train import measure_peak_memory

from rounds import interleaved, median_ratio  # benchmarks/rounds.py, beside this script
from scaler_rounds import alone_lines, cuda_lines  # the scalers alone, and on a GPU
from tiny_gpt import tiny_gpt  # benchmarks/tiny_gpt.py: the model and its text
from zero_rounds import zero_table  # benchmarks/zero_rounds.py: ZeRO-1 against data parallel

OUT = Path(__file__).resolve().parent / "out"
CONTEXT = 64
VARIANTS = ("fp32", "bf16 autocast", "fp16 + GradScaler", "fp16 + LossScaler",
            "fp16 + GradScaler again")
SCALER_BASE = "fp16 + GradScaler"
ALONE_LAYERS = (2, 4, 24)  # 28 gradients (this GPT), 52 and 292 (4 and 24 layers)
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Autocast(nn.Module):
    """`model`'s forward under CPU autocast to `dtype` (None: as it is)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype | None):
        super().__init__()
        self.model, self.dtype = model, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=self.dtype or torch.float32,
                            enabled=self.dtype is not None):
            return self.model(x)


class Scaled:
    """An optimizer whose `step` is `scaler.step(optimizer)` then `scaler.update()`, for
    `measure_peak_memory`'s plain step (its loss_fn scales the loss)."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: Any):
        self.optimizer, self.scaler = optimizer, scaler
        self.state, self.param_groups = optimizer.state, optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()


class Variant:
    """One variant's model, optimizer and scaler, from the same initialisation."""

    def __init__(self, name: str, config: GPTConfig, x: torch.Tensor, y: torch.Tensor):
        torch.manual_seed(0)
        self.name, self.x, self.y = name, x, y
        self.gpt = GPT(config)
        self.model = Autocast(self.gpt, AUTOCAST[name.split()[0]])
        self.optimizer = torch.optim.AdamW(self.gpt.parameters(), lr=3e-3, betas=(0.9, 0.99))
        self.scaler: Any = None
        if "GradScaler" in name:
            self.scaler = torch.amp.GradScaler("cpu")
        elif "LossScaler" in name:
            self.scaler = LossScaler()

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(self.model(self.x), self.y)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def peak_memory(self) -> int:
        """Peak bytes of a step, measured on a fresh copy (this one's init and scaler)."""
        fresh = Variant(self.name, self.gpt.config, self.x, self.y)
        optimizer: Any = fresh.optimizer
        loss_fn: Callable = lm_loss
        if fresh.scaler is not None:
            optimizer = Scaled(fresh.optimizer, fresh.scaler)
            loss_fn = lambda logits, y: fresh.scaler.scale(lm_loss(logits, y))  # noqa: E731
        return measure_peak_memory(fresh.model, optimizer, self.x, self.y, loss_fn,
                                   warmup_steps=3).peak


def precision_table(args: argparse.Namespace, config: GPTConfig, train_ids: torch.Tensor
                    ) -> tuple[list[str], dict]:
    x, y = next(TokenBatches(train_ids, block_size=CONTEXT, batch_size=args.batch, seed=0))
    variants = {name: Variant(name, config, x, y) for name in VARIANTS}
    for variant in variants.values():  # warm up; the scalers find their scale
        for _ in range(3):
            variant.step()
    ours, theirs = variants["fp16 + LossScaler"], variants[SCALER_BASE]
    same = (ours.scaler.get_scale() == theirs.scaler.get_scale() and all(
        torch.equal(a, b) for a, b in zip(ours.gpt.parameters(), theirs.gpt.parameters())))
    if not same:
        raise RuntimeError("LossScaler and GradScaler trained the same fp16 model differently")
    times, _ = interleaved(None, {n: v.step for n, v in variants.items()}, args.rounds,
                           args.steps)
    peaks = {name: v.peak_memory() for name, v in variants.items()}
    alone_text, alone = alone_lines(torch.device("cpu"), ALONE_LAYERS, args.rounds,
                                    args.scaler_calls)

    lines = [f"tiny GPT ({sum(p.numel() for p in ours.gpt.parameters()) / 1e6:.2f} M parameters),"
             f" batch {args.batch} x {CONTEXT} tokens, AdamW, {torch.get_num_threads()} "
             f"threads: one training step, median over {args.rounds} rounds of {args.steps}; "
             f"ratios: median of the per-round ratios",
             f"{'variant':>24} {'ms/step':>8} {'to fp32':>8} {'to GradScaler':>13} "
             f"{'peak MiB':>9} {'to fp32':>8}"]
    results: dict[str, Any] = {"steps": {}, "scaler_alone": {}}
    for name in VARIANTS:
        to_scaler = (f"{median_ratio(times, name, SCALER_BASE):13.3f}" if name.startswith("fp16")
                     else f"{'':>13}")
        lines.append(f"{name:>24} {statistics.median(times[name]) * 1e3:8.1f} "
                     f"{median_ratio(times, name, 'fp32'):8.2f} {to_scaler} "
                     f"{peaks[name] / 2**20:9.2f} {peaks[name] / peaks['fp32']:8.2f}")
        results["steps"][name] = {"seconds": times[name], "peak_bytes": peaks[name]}
    lines.append("the fp16 variants: identical parameters and scales after the warm-up steps "
                 f"(scale {ours.scaler.get_scale():g})")
    lines += ["", *alone_text]
    results["scaler_alone"] = alone
    # the scaler's own work: with a step that does nothing (the same AdamW step either way)
    mine = alone[str(len(list(ours.gpt.parameters())))]  # this GPT's gradients
    extra = statistics.median(a - b for a, b in zip(mine["LossScaler, no step"],
                                                    mine["GradScaler, no step"]))
    fp16_step, fp32_step, bf16_step = (statistics.median(times[n]) for n in
                                       (SCALER_BASE, "fp32", "bf16 autocast"))
    step_ratio = median_ratio(times, "fp16 + LossScaler", SCALER_BASE)
    again = median_ratio(times, "fp16 + GradScaler again", SCALER_BASE)
    lines += [f"LossScaler's extra time per step over GradScaler's: {extra * 1e6:.0f} us = "
              f"{extra / fp16_step:.2%} of an fp16 step here, {extra / fp32_step:.2%} of an "
              f"fp32 step, {extra / bf16_step:.2%} of a bf16 step",
              f"goal, LossScaler adds at most 5% to an fp16 step over GradScaler: "
              f"{'met' if extra / fp16_step <= 0.05 else 'NOT met'} by the scalers alone "
              f"({extra / fp16_step:.2%}); whole fp16 steps, LossScaler's to GradScaler's: "
              f"{step_ratio:.3f} (the noise: GradScaler again, {again:.3f})", ""]
    results.update(extra_seconds=extra, step_ratio=step_ratio, again_ratio=again)
    return lines, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the one-process part (default 1: what each of "
                             "2 ranks gets on 2 cores, and steadier beside other work)")
    parser.add_argument("--scaler-calls", type=int, default=10,
                        help="timed scaler calls per round")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--zero-rounds", type=int, default=9)
    parser.add_argument("--zero-steps", type=int, default=3)
    parser.add_argument("--zero-batch", type=int, default=16, help="sequences per rank")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    config, train_ids, _ = tiny_gpt(CONTEXT)
    lines, precision = precision_table(args, config, train_ids)
    results: dict[str, Any] = {"precision": precision}
    if torch.cuda.is_available():
        cuda_text, results["cuda"] = cuda_lines(args.rounds, args.scaler_calls, args.steps)
        lines += cuda_text
    print("\n".join(lines), flush=True)
    if args.ranks:
        zero_lines, results["zero"] = zero_table(args, config, train_ids)
        lines += zero_lines
    lines.append(f"{time.perf_counter() - start:.0f} s in all on {os.cpu_count()} cores; load "
                 f"average now {os.getloadavg()[0]:.2f}")
    print(lines[-1])
    OUT.mkdir(exist_ok=True)
    (OUT / "mixed_precision.txt").write_text("\n".join(lines) + "\n")
    (OUT / "mixed_precision.json").write_text(json.dumps({"args": vars(args),
                                                          "results": results}, default=str))


if __name__ == "__main__":
    main()
