"""The course's measurements of mixed precision (module 07), each a function a notebook cell calls.

- `gradient_magnitudes`: every gradient entry of one real backward pass, of the parameters and
  of the activations, to set against a format's range (`cast_fate`: what a cast would do);
- `stagnant_share`: how many updates a half-precision weight cannot take (too small for it);
- `autocast_ops`: which operations run in which dtype under `torch.autocast`, from a trace;
- `train_in_precision`: the same GPT, batches and optimizer trained in each precision;
- `scale_sequence`: the scales a loss scaler goes through on a scripted stream of gradients;
- `master_weights_bytes`, `saved_bytes_by_dtype`: what mixed precision really holds;
- `nan_in_gradient`: one rank's overflow, injected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..data import TokenBatches
from ..losses import cross_entropy, next_token_loss
from ..models.gpt import GPT, GPTConfig
from ..train.memory import optimizer_state_bytes, saved_activations
from .master import MasterWeights
from .memory import PerParameter
from .scaler import LossScaler

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Bytes = dict[torch.dtype, int]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The next-token cross-entropy in fp32 whatever the logits' dtype (autocast would leave
    our plain-tensor loss in the logits' half precision)."""
    return next_token_loss(logits.float(), targets, cross_entropy)


# -- gradients against the range of fp16 -----------------------------------------------------


@dataclass
class GradientMagnitudes:
    """|gradient|, nonzero entries only, of the parameters and of the modules' outputs."""

    parameters: torch.Tensor
    activations: torch.Tensor


def gradient_magnitudes(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        loss_fn: LossFn = lm_loss) -> GradientMagnitudes:
    """One forward and backward pass in the model's own precision (fp32); the gradients of the
    parameters and of the outputs of its Linear, LayerNorm and Embedding modules, as absolute
    values, zeros (masked positions, exactly zero already) left out."""
    seen: list[torch.Tensor] = []

    def keep(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        output.register_hook(lambda g: seen.append(g.detach().abs().reshape(-1)))

    kinds = (nn.Linear, nn.LayerNorm, nn.Embedding)
    hooks = [m.register_forward_hook(keep) for m in model.modules() if isinstance(m, kinds)]
    try:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
    finally:
        for h in hooks:
            h.remove()
    params = torch.cat([p.grad.abs().reshape(-1) for p in model.parameters()
                        if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return GradientMagnitudes(params[params > 0], torch.cat(seen)[torch.cat(seen) > 0])


def cast_fate(values: torch.Tensor, scale: float = 1.0,
              dtype: torch.dtype = torch.float16) -> dict[str, float]:
    """The shares of nonzero `values`, times `scale`, that a cast to `dtype` flushes to zero,
    makes subnormal (fewer significant bits: precision lost) or overflows to inf. The cast is
    done, not predicted, so rounding at each boundary is the hardware's."""
    cast = (values.double() * scale).clamp(max=torch.finfo(torch.float32).max).float().to(dtype)
    n = max(values.numel(), 1)
    return {"flushed to zero": float((cast == 0).sum()) / n,
            "subnormal": float(((cast != 0) & (cast.abs() < torch.finfo(dtype).tiny)).sum()) / n,
            "overflow": float(cast.isinf().sum()) / n}


def stagnant_share(weights: torch.Tensor, updates: torch.Tensor,
                   dtype: torch.dtype = torch.float16) -> float:
    """Of the entries with a nonzero update, the share whose weight, held in `dtype`, does not
    change when the update is subtracted in `dtype`: the update is smaller than half the
    spacing of `dtype`'s numbers at the weight (half an ulp), or flushed to zero itself."""
    w, u = weights.to(dtype), updates.to(dtype)
    moving = updates != 0
    return float(((w - u == w) & moving).sum()) / max(int(moving.sum()), 1)


# -- which operations autocast runs in which dtype -------------------------------------------

VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "detach", "alias", "split",
         "unsqueeze", "squeeze", "clone", "new_zeros", "ones_like", "scalar_tensor", "arange"}


@dataclass(frozen=True)
class OpRecord:
    """One aten operation of a traced step: name, floating inputs' and output's dtypes, and
    "forward" or "backward"."""

    name: str
    inputs: tuple[torch.dtype, ...]
    output: torch.dtype
    phase: str


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[OpRecord] = []
        self.phase = "forward"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if isinstance(first, torch.Tensor) and first.is_floating_point():
            flat = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
            self.records.append(OpRecord(func.overloadpacket.__name__,
                                         tuple(a.dtype for a in flat), first.dtype, self.phase))
        return out


def autocast_ops(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype,
                 loss_fn: LossFn = lm_loss) -> list[OpRecord]:
    """Every aten operation with a floating output in one forward (under
    `torch.autocast("cpu", dtype)`) and backward pass, recorded below autocast by a
    `TorchDispatchMode`, so each shows the dtype it really ran in."""
    with _Recorder() as recorder:
        with torch.autocast("cpu", dtype=dtype):
            logits = model(x)
        loss = loss_fn(logits, y)
        recorder.phase = "backward"
        loss.backward()
    model.zero_grad(set_to_none=True)
    return recorder.records


def ops_by_dtype(records: Iterable[OpRecord], phase: str) -> dict[torch.dtype, list[str]]:
    """The names of the computing operations (views and layout changes left out) of `phase`,
    by the dtype of their output; `_to_copy` is a cast."""
    pairs = {(r.output, r.name) for r in records if r.phase == phase and r.name not in VIEWS}
    return {d: sorted(name for kind, name in pairs if kind == d)
            for d in sorted({kind for kind, _ in pairs}, key=str)}


# -- training in each precision ---------------------------------------------------------------

MODES = ("fp32", "fp16", "fp16 autocast", "fp16 autocast + scaling", "fp16 + master + scaling",
         "bf16 autocast")


@dataclass
class PrecisionRun:
    """A run's loss at every step (to the first inf or nan), the steps its loss scaler
    skipped, the scale after each step, and its seconds."""

    mode: str
    losses: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def final(self, last: int = 10) -> float:
        """The mean loss of the last `last` steps: nan (or inf) if the run diverged."""
        return sum(self.losses[-last:]) / last


def train_in_precision(mode: str, tokens: torch.Tensor, config: GPTConfig, steps: int = 150,
                       batch_size: int = 16, lr: float = 3e-3, seed: int = 0,
                       shrink: float = 1.0, growth_interval: int = 2000) -> PrecisionRun:
    """Train `GPT(config)` (weights from `seed`, the same in every mode) on the same batches
    with AdamW, in one of `MODES`: "fp32"; "fp16": fp16 weights, AdamW on them, no scaling;
    "fp16 autocast": fp32 weights, the forward under autocast fp16 (torch's AMP recipe once
    "+ scaling" adds a `LossScaler`); "fp16 + master + scaling": fp16 weights, `MasterWeights`
    and a `LossScaler`; "bf16 autocast". The loss is computed in fp32 and backpropagated times
    `shrink`, every gradient with it, as a larger model's are smaller (AdamW's steps hardly
    change: it divides by the gradients' size). A run stops at its first inf or nan."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    torch.manual_seed(seed)
    model = GPT(config)
    if mode.startswith("fp16") and "autocast" not in mode:
        model = model.half()
    optimizer: Any = torch.optim.AdamW(model.parameters(), lr=lr)
    if "master" in mode:
        optimizer = MasterWeights(model.parameters(), torch.optim.AdamW, lr=lr)
    scaler = LossScaler(growth_interval=growth_interval) if "scaling" in mode else None
    cast = {"fp16 autocast": torch.float16, "bf16 autocast": torch.bfloat16}.get(
        mode.replace(" + scaling", ""))
    batches = TokenBatches(tokens, config.block_size, batch_size, seed=seed)
    run = PrecisionRun(mode)
    start = time.perf_counter()
    for step in range(steps):
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=cast or torch.bfloat16, enabled=cast is not None):
            logits = model(x)
        loss = lm_loss(logits, y)
        run.losses.append(loss.item())
        if not math.isfinite(run.losses[-1]):
            break
        loss = loss * shrink
        if scaler is None:
            loss.backward()
            optimizer.step()
            continue
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        if scaler.skipped:
            run.skipped.append(step)
        scaler.update()
        run.scales.append(scaler.get_scale())
    run.seconds = time.perf_counter() - start
    return run


def scale_sequence(scaler: Any, gradients: Sequence[float]) -> tuple[list[float], list[bool]]:
    """One step of `scaler` (a `LossScaler` or a `torch.amp.GradScaler("cpu")`) per g in
    `gradients`: the loss g * w of a one-weight SGD model, scaled and backpropagated. Returns
    the scale after every update, and whether each step moved the weight."""
    weight, scales, stepped = torch.zeros(1, requires_grad=True), [], []
    optimizer = torch.optim.SGD([weight], lr=1.0)
    for g in gradients:
        before = weight.detach().clone()
        optimizer.zero_grad()
        scaler.scale((weight * g).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        stepped.append(not torch.equal(before, weight.detach()))
    return scales, stepped


# -- what mixed precision holds ----------------------------------------------------------------


def master_weights_bytes(model: nn.Module, master: MasterWeights) -> PerParameter:
    """Bytes per parameter a model under `MasterWeights` holds after a step, from its tensors:
    half-precision parameters; gradients (the model's left, the masters' fp32 ones); optimizer
    state (the fp32 masters and their moments)."""
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    grads = sum(p.grad.nbytes for p in params if p.grad is not None)
    grads += sum(m.grad.nbytes for m in master.masters if m.grad is not None)
    state = sum(m.nbytes for m in master.masters) + optimizer_state_bytes(master.optimizer,
                                                                          counters=False)
    return PerParameter(sum(p.nbytes for p in params) / n, grads / n, state / n)


def saved_bytes_by_dtype(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         dtype: torch.dtype | None, loss_fn: LossFn = lm_loss) -> Bytes:
    """The bytes autograd saves for the backward pass in one forward (under autocast in
    `dtype`; None: none), by dtype: distinct storages, the model's own tensors left out."""
    with saved_activations(model) as saved:
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x)
        loss_fn(logits, y)
    by_dtype: dict[torch.dtype, int] = {}
    for kind, nbytes in saved.values():
        by_dtype[kind] = by_dtype.get(kind, 0) + nbytes
    return by_dtype


@contextmanager
def nan_in_gradient(param: torch.Tensor, index: int = 0) -> Iterator[None]:
    """Within the block, the gradient computed for `param` has a nan at flat `index` (as if
    one entry of this rank's backward overflowed), before it is accumulated or sent."""

    def poison(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad.view(-1)[index] = math.nan
        return grad

    handle = param.register_hook(poison)
    try:
        yield
    finally:
        handle.remove()
