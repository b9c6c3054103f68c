"""lib_dist's `LossScaler` against torch's `GradScaler` on one device, in interleaved rounds:
for benchmarks/mixed_precision.py (on the CPU, and on CUDA when there is one) and
benchmarks/gpu_check.py.

- `scalers_alone`: `unscale_` + `step` + `update` on the same scaled gradients, those of module
  02's GPT at width 64 with `n_layer` layers (52 tensors at 4 layers, 292 at 24), restored
  before every call outside the timing; once with AdamW (`foreach`, torch's default on a GPU)
  and once with an optimizer whose step does nothing (the scaler's own work alone);
- `whole_steps`: one training step under fp16 autocast (forward, backward, the scaler, AdamW)
  with each scaler, from the same initialisation on the same batch, after checking that the two
  made the same decisions (the same scale, the same steps skipped) during the warm-up.

On a GPU every timed call ends with `torch.cuda.synchronize()`, so that a time is the work's,
not the launches'. `ratios` gives the median over rounds of LossScaler's time over GradScaler's
in the same round.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable, cast

import torch
import torch.nn.functional as F

from lib_dist.mixed_precision import LossScaler
from lib_dist.models import GPT, GPTConfig

SCALERS: dict[str, Callable[..., Any]] = {
    "GradScaler": lambda device, scale: torch.amp.GradScaler(device.type, init_scale=scale),
    "LossScaler": lambda device, scale: LossScaler(init_scale=scale),
}


class NoStep:
    """An optimizer over `params` whose step does nothing: the scaler's own work alone. Not a
    torch.optim.Optimizer (whose step hooks would be timed too): what the scalers use of one,
    `param_groups`, `state` and `step()`."""

    def __init__(self, params: list[torch.Tensor]):
        self.param_groups = [{"params": params}]
        self.state: dict = {}

    def step(self) -> None:
        return None

    @classmethod
    def of(cls, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """One, where the scalers' signatures say torch.optim.Optimizer."""
        return cast(torch.optim.Optimizer, cls(params))


def sync(device: torch.device) -> None:
    """Wait for `device` (a GPU) to finish what was queued; nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpt(n_layer: int, device: torch.device, n_embd: int = 64, block_size: int = 64,
        vocab_size: int = 96) -> GPT:
    """Module 02's GPT with `n_layer` layers, seeded, on `device`."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=4,
                       n_embd=n_embd)
    return GPT(config).to(device)


def scalers_alone(device: torch.device, n_layer: int, rounds: int, calls: int,
                  scalers: dict[str, Callable[..., Any]] | None = None,
                  scale: float = 2.0**16) -> dict[str, list[float]]:
    """Seconds per `unscale_` + `step` + `update` of each scaler of `scalers` (default
    `SCALERS`), by round, keyed "SCALER, AdamW" and "SCALER, no step"; finite gradients of
    standard deviation 2^-10 times `scale`."""
    generator = torch.Generator().manual_seed(1)
    shapes = [p.shape for p in gpt(n_layer, torch.device("cpu")).parameters()]
    grads = [(torch.randn(shape, generator=generator) * 2.0**-10 * scale).to(device)
             for shape in shapes]
    jobs = {}
    for optimizer_name in ("AdamW", "no step"):
        for scaler_name, make in (scalers or SCALERS).items():
            params = [torch.zeros(shape, device=device, requires_grad=True) for shape in shapes]
            optimizer = (torch.optim.AdamW(params, lr=1e-3) if optimizer_name == "AdamW"
                         else NoStep.of(params))
            scaler = make(device, scale)
            scaler.scale(torch.ones((), device=device))  # GradScaler makes its scale on first use
            jobs[f"{scaler_name}, {optimizer_name}"] = (params, optimizer, scaler)
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    for i in range(rounds):
        order = list(jobs)
        random.Random(100 + i).shuffle(order)
        for name in order:
            params, optimizer, scaler = jobs[name]
            total = 0.0
            for _ in range(calls):
                for p, g in zip(params, grads):
                    p.grad = g.clone()
                sync(device)
                start = time.perf_counter()
                scaler.unscale_(optimizer)
                scaler.step(optimizer)
                scaler.update()
                sync(device)
                total += time.perf_counter() - start
            seconds[name].append(total / calls)
    return seconds


def whole_steps(device: torch.device, n_layer: int, rounds: int, steps: int, batch: int,
                n_embd: int = 64, block_size: int = 64) -> dict[str, list[float]]:
    """Seconds per fp16-autocast training step with each scaler of `SCALERS` (and GradScaler
    once more, "GradScaler again": the noise), by round. Raises if the scalers' decisions
    differ over the warm-up."""
    generator = torch.Generator().manual_seed(2)
    x, y = (torch.randint(0, 96, (batch, block_size), generator=generator).to(device)
            for _ in range(2))
    calls, models = {}, {}
    for name in ("GradScaler", "LossScaler", "GradScaler again"):
        model = gpt(n_layer, device, n_embd=n_embd, block_size=block_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        scaler = SCALERS[name.split()[0]](device, 2.0**16)

        def step(model: GPT = model, optimizer: Any = optimizer, scaler: Any = scaler) -> None:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            sync(device)

        calls[name], models[name] = step, scaler
    scales: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(5):  # the warm-up: the scalers find their scale
        for name, step in calls.items():
            step()
            scales[name].append(models[name].get_scale())
    if scales["LossScaler"] != scales["GradScaler"]:
        raise RuntimeError(f"LossScaler and GradScaler took different decisions: scales "
                           f"{scales['LossScaler']} against {scales['GradScaler']}")
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(rounds):
        order = list(calls)
        random.Random(i).shuffle(order)
        for name in order:
            start = time.perf_counter()
            for _ in range(steps):
                calls[name]()
            seconds[name].append((time.perf_counter() - start) / steps)
    return seconds


def ratio(times: dict[str, list[float]], name: str, base: str) -> float:
    """The median over rounds of `name`'s time over `base`'s in the same round."""
    return statistics.median(t / b for t, b in zip(times[name], times[base]))


def alone_lines(device: torch.device, layers: tuple[int, ...], rounds: int, calls: int
                ) -> tuple[list[str], dict[str, Any]]:
    """A table of `scalers_alone` on `device` for each number of layers, and its figures."""
    lines = [f"the scalers alone on {device.type}: unscale_ + step + update on the same scaled "
             f"gradients, median over {rounds} rounds of {calls} calls",
             f"{'gradients':>9} {'optimizer':>9} {'GradScaler us':>13} {'LossScaler us':>13} "
             f"{'ratio':>6}"]
    results: dict[str, Any] = {}
    for n_layer in layers:
        seconds = scalers_alone(device, n_layer, rounds, calls)
        count = len(list(gpt(n_layer, torch.device("cpu")).parameters()))
        for optimizer in ("AdamW", "no step"):
            ours, theirs = f"LossScaler, {optimizer}", f"GradScaler, {optimizer}"
            lines.append(f"{count:>9} {optimizer:>9} "
                         f"{statistics.median(seconds[theirs]) * 1e6:13.0f} "
                         f"{statistics.median(seconds[ours]) * 1e6:13.0f} "
                         f"{ratio(seconds, ours, theirs):6.2f}")
        results[str(count)] = seconds
    return lines, results


def cuda_lines(rounds: int, calls: int, steps: int) -> tuple[list[str], dict[str, Any]]:
    """On the GPU: the scalers alone on 52 and 292 gradients, and whole fp16 steps of a
    4-layer GPT of width 256, context 256, batch 16 (52 gradients), against the goal that
    LossScaler's step takes at most 1.05 times GradScaler's."""
    device = torch.device("cuda")
    lines, results = alone_lines(device, (4, 24), rounds, calls)
    seconds = whole_steps(device, 4, rounds, steps, batch=16, n_embd=256, block_size=256)
    step_ratio = ratio(seconds, "LossScaler", "GradScaler")
    again = ratio(seconds, "GradScaler again", "GradScaler")
    lines.append(f"whole fp16 steps on {torch.cuda.get_device_name(device)}, 4-layer GPT (width "
                 f"256, batch 16 x 256): GradScaler "
                 f"{statistics.median(seconds['GradScaler']) * 1e3:.2f} ms, LossScaler "
                 f"{statistics.median(seconds['LossScaler']) * 1e3:.2f} ms, ratio "
                 f"{step_ratio:.3f}: goal <= 1.05 {'met' if step_ratio <= 1.05 else 'NOT met'} "
                 f"(the noise: GradScaler again, {again:.3f})")
    alone_ratios = {count: ratio(times, "LossScaler, AdamW", "GradScaler, AdamW")
                    for count, times in results.items()}
    results.update(whole_steps=seconds, step_ratio=step_ratio, again_ratio=again,
                   alone_ratios=alone_ratios)
    return lines, results
