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
        self._found_inf: dict[int, bool] = {}

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times the current scale: call `.backward()` on this."""
        return loss * self._scale.to(loss.device)  # not cast to fp16 first: 2**16 is inf there

    def unscale_(self, optimizer: Any) -> None:
        """Divide the gradients of `optimizer`'s parameters by the scale, in place, and record
        whether any of them is inf or nan. At most once per optimizer between updates."""
        stage = self._stages.get(id(optimizer), _READY)
        if stage == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update()")
        if stage == _STEPPED:
            raise RuntimeError("unscale_() is being called after step()")
        inv_scale = self._scale.double().reciprocal().float()
        found = False
        for grad in gradients(optimizer):
            found |= not bool(torch.isfinite(grad).all())
            grad.mul_(inv_scale.to(grad.device))  # the product in fp32, rounded once
        self._found_inf[id(optimizer)] = self.agree(found)
        self._stages[id(optimizer)] = _UNSCALED

    def agree(self, found_inf: bool) -> bool:
        """Whether this step overflowed, from this process's finding: itself, here. The
        distributed scaler (`distributed.py`) asks every rank."""
        return found_inf

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale if not done yet, then `optimizer.step()` unless a gradient was inf or nan;
        returns what the step returned, or None when skipped."""
        if "closure" in kwargs:
            raise RuntimeError("LossScaler.step does not support closures")
        if self._stages.get(id(optimizer), _READY) == _STEPPED:
            raise RuntimeError("step() has already been called since the last update()")
        if self._stages.get(id(optimizer), _READY) == _READY:
            self.unscale_(optimizer)
        result = None if self._found_inf[id(optimizer)] else optimizer.step(*args, **kwargs)
        self._stages[id(optimizer)] = _STEPPED
        return result

    def update(self) -> None:
        """Back off after an overflow, grow after `growth_interval` clean steps; then forget
        this iteration's findings."""
        if not self._found_inf:
            raise RuntimeError("update() needs unscale_() or step() on some optimizer first")
        # As GradScaler's kernel: the float32 scale times the factor in double, rounded once.
        if any(self._found_inf.values()):
            self._scale.copy_(self._scale.double() * self.backoff_factor)
            self._growth_tracker = 0
        elif self._growth_tracker + 1 == self.growth_interval:
            grown = (self._scale.double() * self.growth_factor).float()
            if torch.isfinite(grown):
                self._scale.copy_(grown)
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
        self._stages.clear()
        self._found_inf.clear()

    @property
    def skipped(self) -> bool:
        """Whether the iteration being finished found an overflow (read before `update`)."""
        return any(self._found_inf.values())

    def get_scale(self) -> float:
        """The current scale, a Python float."""
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
