"""Dynamic loss scaling: the decisions of `torch.amp.GradScaler`, written out.

Half-precision gradients underflow: fp16's smallest positive number is about 6e-8, and many of
a network's gradients are smaller. Multiplying the loss by a large scale S multiplies every
gradient by S (backpropagation is linear in the loss), lifting them into range; dividing the
gradients by S before the optimizer uses them ("unscaling") undoes it. Too large an S overflows
instead: some gradient becomes inf, or nan. So S is chosen dynamically:

- after the backward, unscale the gradients and check them for inf/nan;
- found: skip this step (the gradients are garbage) and multiply S by `backoff_factor`;
- not found: step, and after `growth_interval` clean steps in a row multiply S by
  `growth_factor`, probing whether a larger scale still fits.

`LossScaler` keeps `GradScaler`'s interface subset (`scale`, `unscale_`, `step`, `update`,
`get_scale`, `state_dict`, `load_state_dict`) and makes the same decisions: given the same
gradients it skips the same steps and produces the same sequence of scales. Like GradScaler,
it keeps S as a float32 tensor, so that its arithmetic is GradScaler's. Unlike GradScaler it
unscales half-precision gradients too (master weights, `master.py`, keep fp32 copies of them).

On a GPU the cost is in the waiting, not the arithmetic: reading a number that lives on the GPU
(`bool(t)`, `t.item()`) makes the CPU wait until the GPU has finished everything queued before
it, and every kernel costs the CPU microseconds to launch. A scaler that checked each gradient
with `bool(torch.isfinite(grad).all())` would wait once per gradient, hundreds of times a step.
So, as GradScaler does, this one unscales and checks all the gradients of one device and dtype
with one fused kernel, writing a flag that stays on the device; keeps S on the device of the
loss it scales, updating it there; and reads the flag once per optimizer step, when `step` must
decide whether to skip (`unscale_and_check`).
"""

from __future__ import annotations

from typing import Any

import torch

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class LossScaler:
    """Dynamic loss scaling with `torch.amp.GradScaler`'s decisions (module docstring)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        if growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
        self._scale = torch.tensor(float(init_scale), dtype=torch.float32)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self._growth_tracker = 0
        self._stages: dict[int, str] = {}
        self._found_inf: dict[int, torch.Tensor] = {}  # id(optimizer) -> flag, on the device
        self._decided: dict[int, bool] = {}  # id(optimizer) -> skip, once the flag was read

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times the current scale: call `.backward()` on this. The scale moves to the
        loss's device on first use and stays there (no copy per step)."""
        if self._scale.device != loss.device:
            self._scale = self._scale.to(loss.device)
        return loss * self._scale  # not cast to fp16 first: 2**16 is inf there

    def unscale_(self, optimizer: Any) -> None:
        """Divide the gradients of `optimizer`'s parameters by the scale, in place, and record
        whether any of them is inf or nan (on the device: read when `step` decides). At most
        once per optimizer between updates."""
        stage = self._stages.get(id(optimizer), _READY)
        if stage == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update()")
        if stage == _STEPPED:
            raise RuntimeError("unscale_() is being called after step()")
        inv_scale = self._scale.double().reciprocal().float()
        self._found_inf[id(optimizer)] = unscale_and_check(gradients(optimizer), inv_scale)
        self._stages[id(optimizer)] = _UNSCALED

    def agree(self, found_inf: bool) -> bool:
        """Whether this step overflowed, from this process's finding: itself, here. The
        distributed scaler (`distributed.py`) asks every rank."""
        return found_inf

    def _overflowed(self, key: int) -> bool:
        """The decision for the optimizer `key`: its flag read once (the step's one wait for
        the device), then agreed."""
        if key not in self._decided:
            self._decided[key] = self.agree(bool(self._found_inf[key]))
        return self._decided[key]

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale if not done yet, then `optimizer.step()` unless a gradient was inf or nan;
        returns what the step returned, or None when skipped."""
        if "closure" in kwargs:
            raise RuntimeError("LossScaler.step does not support closures")
        if self._stages.get(id(optimizer), _READY) == _STEPPED:
            raise RuntimeError("step() has already been called since the last update()")
        if self._stages.get(id(optimizer), _READY) == _READY:
            self.unscale_(optimizer)
        result = None if self._overflowed(id(optimizer)) else optimizer.step(*args, **kwargs)
        self._stages[id(optimizer)] = _STEPPED
        return result

    def update(self) -> None:
        """Back off after an overflow, grow after `growth_interval` clean steps; then forget
        this iteration's findings. The scale changes on its device, without waiting for it."""
        if not self._found_inf:
            raise RuntimeError("update() needs unscale_() or step() on some optimizer first")
        # As GradScaler's kernel: the float32 scale times the factor in double, rounded once.
        if self.skipped:
            self._scale.copy_(self._scale.double() * self.backoff_factor)
            self._growth_tracker = 0
        elif self._growth_tracker + 1 == self.growth_interval:
            grown = (self._scale.double() * self.growth_factor).float()
            self._scale.copy_(torch.where(torch.isfinite(grown), grown, self._scale))
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
        self._stages.clear()
        self._found_inf.clear()
        self._decided.clear()

    @property
    def skipped(self) -> bool:
        """Whether the iteration being finished found an overflow (read before `update`)."""
        return any(self._overflowed(key) for key in self._found_inf)

    def get_scale(self) -> float:
        """The current scale, a Python float (read from its device: a wait on a GPU)."""
        return float(self._scale)

    def state_dict(self) -> dict[str, Any]:
        """GradScaler's state dict: the scale, the factors, the interval, the tracker."""
        return {"scale": self.get_scale(), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` (this class's or GradScaler's) returned."""
        self._scale.fill_(state["scale"])
        self.growth_factor, self.backoff_factor = state["growth_factor"], state["backoff_factor"]
        self.growth_interval = state["growth_interval"]
        self._growth_tracker = state["_growth_tracker"]


def gradients(optimizer: Any) -> list[torch.Tensor]:
    """The gradients of every parameter of `optimizer` that has one."""
    return [p.grad for group in optimizer.param_groups for p in group["params"]
            if p.grad is not None]


def unscale_and_check(grads: list[torch.Tensor], inv_scale: torch.Tensor) -> torch.Tensor:
    """Multiply every gradient by `inv_scale` in place and return a flag, on `inv_scale`'s
    device: 1.0 if any gradient held an inf or nan before, else 0.0. For each gradient it does

        found |= not torch.isfinite(grad).all();  grad.mul_(inv_scale)  # in fp32, rounded once

    but with GradScaler's own fused kernel, one call per device and dtype: no wait for the
    device, and on a GPU a few kernel launches for hundreds of gradients, not two per gradient."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault((grad.device, grad.dtype), []).append(grad)
    flags: dict[torch.device, torch.Tensor] = {}  # the kernel sets its flag, never clears it
    for (device, _), group in groups.items():
        if device not in flags:
            flags[device] = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, flags[device], inv_scale.to(device))
    found = [flag.to(inv_scale.device) for flag in flags.values()]
    return sum(found[1:], found[0]) if found else torch.zeros(1, device=inv_scale.device)
