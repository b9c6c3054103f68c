"""The memory budget of training: parameters, gradients, optimizer state and activations.

Training holds four kinds of tensors:

- the parameters (P numbers);
- one gradient per parameter (P more);
- the optimizer's state: a momentum buffer for SGD with momentum (P), two running moments for
  Adam and AdamW (2P);
- the activations autograd saved during the forward pass to compute the backward pass. Unlike
  the other three, they grow with the batch size and the sequence length.

They are not all held at once. The backward pass frees each saved activation as soon as the
gradient that needed it is computed, while it allocates the gradients: activations shrink as
gradients grow. Memory peaks early in the backward pass, when nearly every activation is still
held and the first gradients (with the backward's temporary results, such as the gradient of
the logits) are allocated. The four-way sum `MemoryBudget.total` is therefore not the peak: it
counts the activations and the gradients in full, together, which never happens, and it leaves
out temporaries. It is the budget to plan with, not a measurement of the peak.

`gpt_memory_estimate` predicts all four for `lib_dist.models.GPT` from its configuration alone;
`measure_training_memory` measures them on a real step, counting the tensors autograd actually
saves (through `torch.autograd.graph.saved_tensors_hooks`), so the two can be compared.
`measure_peak_memory` measures what a step really holds, moment by moment: every allocation and
release of PyTorch's CPU allocator during the step, recorded by `torch.profiler`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from ..models.gpt import GPTConfig
from .step import LossFn


@dataclass
class MemoryBudget:
    """Bytes of each kind of tensor training holds."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int

    @property
    def total(self) -> int:
        """The four-way sum: the budget to plan with. Not the peak, which is lower because
        the backward pass frees activations while it allocates gradients (module docstring)."""
        return self.parameters + self.gradients + self.optimizer_state + self.activations

    def rows(self) -> list[tuple[str, int]]:
        return [("parameters", self.parameters), ("gradients", self.gradients),
                ("optimizer state", self.optimizer_state), ("activations", self.activations),
                ("total", self.total)]


def gpt_num_params(config: GPTConfig) -> int:
    """Parameters of `GPT(config)`: V*C token embeddings (shared with the output head), T*C
    position embeddings, 12*C^2 + 13*C per layer, and 2*C for the final LayerNorm.

    Per layer: the query/key/value projection (3C^2 + 3C), the attention output projection
    (C^2 + C), the MLP's two linear maps (4C^2 + 4C and 4C^2 + C), two LayerNorms (2 * 2C).
    """
    V, T, C, L = config.vocab_size, config.block_size, config.n_embd, config.n_layer
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def gpt_activation_bytes(config: GPTConfig, batch_size: int, seq_len: int | None = None) -> int:
    """Bytes autograd saves in one forward pass of `GPT(config)` in float32 with
    `F.cross_entropy` as the loss (dropout must be 0: dropout would add its masks).

    With B sequences of T tokens, C channels and h heads, each layer saves 16*B*T*C floats:
    the inputs of both LayerNorms (2), their outputs (2), the queries, keys and values (3), the
    attention output before its projection (1), the MLP's hidden layer before and after GELU
    (4 + 4); also the LayerNorms' means and inverse standard deviations (4*B*T floats), the
    attention weights after softmax (B*h*T*T floats: quadratic in the sequence length), and the
    causal mask (T*T booleans, one byte each). After the layers: the final LayerNorm's input,
    output and statistics (2*B*T*C + 2*B*T floats), the log-probabilities over the vocabulary
    (B*T*V floats), the token ids, positions and targets (int64), and the loss's one-float
    normaliser.
    """
    if config.dropout:
        raise ValueError("the estimate assumes dropout=0 (dropout saves a mask per layer)")
    B, T = batch_size, seq_len or config.block_size
    C, h, L, V = config.n_embd, config.n_head, config.n_layer, config.vocab_size
    f32, i64, bool_ = 4, 8, 1
    per_layer = f32 * (16 * B * T * C + 4 * B * T + B * h * T * T) + bool_ * T * T
    head = f32 * (2 * B * T * C + 2 * B * T + B * T * V)
    indices = i64 * (B * T + T + B * T)
    return L * per_layer + head + indices + f32


def gpt_memory_estimate(config: GPTConfig, batch_size: int, optimizer_slots: int = 2,
                        seq_len: int | None = None) -> MemoryBudget:
    """The predicted budget of one float32 training step of `GPT(config)`.

    `optimizer_slots` is the number of tensors the optimizer keeps per parameter: 0 for plain
    SGD, 1 for SGD with momentum, 2 for Adam/AdamW (the step counters are not counted).
    """
    params = 4 * gpt_num_params(config)
    return MemoryBudget(params, params, optimizer_slots * params,
                        gpt_activation_bytes(config, batch_size, seq_len))


def measure_training_memory(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                            y: torch.Tensor, loss_fn: LossFn) -> MemoryBudget:
    """Run one training step on (x, y) and measure the bytes of each kind of tensor.

    Activations are the distinct storages autograd saved during the forward pass, excluding the
    model's own parameters and buffers. The step really updates the model.
    """
    optimizer.zero_grad(set_to_none=True)
    with saved_activations(model) as saved:
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    params = list(model.parameters())
    return MemoryBudget(
        parameters=sum(p.nbytes for p in params),
        gradients=sum(p.grad.nbytes for p in params if p.grad is not None),
        optimizer_state=optimizer_state_bytes(optimizer, counters=False),
        activations=sum(nbytes for _, nbytes in saved.values()),
    )


@contextmanager
def saved_activations(model: nn.Module) -> Iterator[dict[int, tuple[torch.dtype, int]]]:
    """Within the block, the distinct storages autograd saves for the backward pass, the
    model's own parameters and buffers left out: {storage address: (dtype, bytes)}."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, tuple[torch.dtype, int]] = {}
    # held until the block ends: a saved tensor whose graph is dropped during the forward (a
    # branch that no output depends on) would free its memory, and a later saved tensor at
    # the same address would be taken for it
    alive: list[torch.UntypedStorage] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved.setdefault(storage.data_ptr(), (t.dtype, storage.nbytes()))
            alive.append(storage)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


def optimizer_state_bytes(optimizer: Any, counters: bool = True) -> int:
    """Bytes of every tensor an optimizer keeps in its per-parameter state (without its 0-d
    step counts when not `counters`)."""
    return sum(value.nbytes for state in optimizer.state.values() for value in state.values()
               if isinstance(value, torch.Tensor) and (counters or value.dim() > 0))


PHASES = ("forward", "backward", "optimizer step")


@dataclass
class PeakMemory:
    """What one training step held, measured by PyTorch's CPU allocator.

    `before` is what was held when the step started (the parameters, the optimizer's state, any
    gradients and the batch), `peak` the most held at any moment of the step, `phase` the part of
    the step it happened in and `into_phase` how far into it (0 at its start, 1 at its end).
    `timeline` is (milliseconds since the step started, bytes held) after every allocation and
    release; `phases` maps each phase to its (start, end) in the same milliseconds.
    """

    before: int
    peak: int
    phase: str
    into_phase: float
    timeline: list[tuple[float, int]] = field(repr=False)
    phases: dict[str, tuple[float, float]] = field(repr=False)


def measure_peak_memory(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                        y: torch.Tensor, loss_fn: LossFn, warmup_steps: int = 1) -> PeakMemory:
    """Run `warmup_steps` training steps on (x, y), then one more under `torch.profiler` with
    `profile_memory=True`, and return what that step held, moment by moment (CPU tensors).

    The warm-up makes the measured step a typical one: AdamW creates its moments in its first
    step. The profiler records every allocation and release of the CPU allocator during the step,
    so the measurement includes what `MemoryBudget` does not count: temporary results, and the
    gradient of the logits that the backward pass computes first. Held before the step: the
    model's parameters and buffers, the batch, and the optimizer's parameters and state (for
    ZeRO's optimizers and master weights, the float32 shards or copies it steps). The steps
    really update the model.
    """
    if x.device.type != "cpu":
        raise ValueError("measure_peak_memory reads the CPU allocator: pass CPU tensors")

    def step() -> None:  # the labels mark the phases in the profiler's trace
        optimizer.zero_grad(set_to_none=True)
        with record_function(PHASES[0]):
            loss = loss_fn(model(x), y)
        with record_function(PHASES[1]):
            loss.backward()
        with record_function(PHASES[2]):
            optimizer.step()

    for _ in range(warmup_steps):
        step()
    optimizer.zero_grad(set_to_none=True)
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in map(_local, [*model.parameters(), *model.buffers(), x, y,
                                  *(p for g in optimizer.param_groups for p in g["params"]),
                                  *(v for s in optimizer.state.values() for v in s.values()
                                    if isinstance(v, torch.Tensor))])}
    before = sum(held.values())
    events = profiled_events(step)
    spans = {e["name"]: (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("name") in PHASES and e.get("ph") == "X"}
    start = spans[PHASES[0]][0]
    changes = [(ts, change) for ts, change in cpu_allocations(events)
               if start <= ts <= spans[PHASES[2]][1]]
    timeline, now = [(0.0, before)], before
    for ts, change in changes:
        now += change
        timeline.append(((ts - start) / 1e3, now))
    when, peak = max(timeline, key=lambda point: point[1])
    phases = {name: ((a - start) / 1e3, (b - start) / 1e3) for name, (a, b) in spans.items()}
    phase = next((name for name in PHASES if phases[name][0] <= when <= phases[name][1]),
                 PHASES[0])
    a, b = phases[phase]
    return PeakMemory(before, peak, phase, (when - a) / (b - a) if b > a else 0.0, timeline,
                      phases)


def profiled_events(fn: Callable[[], Any]) -> list[dict]:
    """Run `fn()` under `torch.profiler` with `profile_memory=True`: its Chrome-trace events."""
    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU],
                                            profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        return json.loads(trace.read_text())["traceEvents"]


def cpu_allocations(events: list[dict]) -> list[tuple[float, int]]:
    """The CPU allocator's changes among `events`, in time order: (microseconds, bytes + or -).
    Only the calling thread's are recorded."""
    return sorted((float(e["ts"]), int(e["args"]["Bytes"])) for e in events
                  if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)


def _local(t: torch.Tensor) -> torch.Tensor:
    """What this process holds of `t`: a DTensor's local shard (torch's FSDP2), else `t`."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """The profiler's native code writes a line to file descriptor 2 when it starts and stops;
    send those to /dev/null. Python's exceptions and warnings are unaffected."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def format_budgets(**budgets: MemoryBudget) -> str:
    """A table with one column per budget, in MiB, e.g. format_budgets(estimate=e, measured=m)."""
    names = list(budgets)
    lines = [f"{'':<16}" + "".join(f"{n:>13}" for n in names)]
    for i, (label, _) in enumerate(next(iter(budgets.values())).rows()):
        lines.append(f"{label:<16}" + "".join(f"{b.rows()[i][1] / 2**20:>9.3f} MiB"
                                              for b in budgets.values()))
    return "\n".join(lines)
