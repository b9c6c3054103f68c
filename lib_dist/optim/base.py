"""The base class of the course's optimizers: the loop is here, the update rule is yours.

An optimizer changes every parameter `p` using its gradient and whatever it remembers about `p`
from earlier steps (a momentum buffer, running moments). Everything except that rule is the
same for every optimizer, and is done here, by `torch.optim.Optimizer`'s machinery: parameter
groups, per-parameter state, `zero_grad`, `state_dict` / `load_state_dict` for checkpoints.
So an `Optimizer` works anywhere a `torch.optim` optimizer does (training loops, LR schedulers).

The contract, for a subclass:

- `__init__(self, params, ...)` calls `super().__init__(params, lr=lr, **other_hyperparameters)`.
  `params` is an iterable of tensors, or of dicts (parameter groups) that override the defaults
  for some parameters, e.g. `[{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]`.
- `update(self, p, grad, state, group)` is called by `step()` once per parameter that has a
  gradient, under `torch.no_grad()`. It must change `p` in place (`p.add_`, `p.mul_`,
  `p.addcdiv_`, ...: never rebind `p.data`), and may keep tensors in `state`, the dict of this
  parameter alone. `state` is empty on `p`'s first step except for `state["step"]`, the number
  of updates of `p` including this one (1 on the first call). `group` holds the
  hyperparameters for `p`: `group["lr"]` and the others passed to `__init__`.
- Parameters whose `.grad` is None (unused this step, or frozen) are skipped: their state does
  not change and `state["step"]` does not advance.

    class SignSGD(Optimizer):
        def __init__(self, params, lr=0.01):
            super().__init__(params, lr=lr)

        def update(self, p, grad, state, group):
            p.add_(grad.sign(), alpha=-group["lr"])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class Optimizer(torch.optim.Optimizer):
    """Subclass and implement `update`; see the module docstring for the contract."""

    def __init__(self, params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
                 **defaults: Any):
        if "lr" not in defaults:
            raise TypeError(f"{type(self).__name__}: pass the learning rate to "
                            f"super().__init__(params, lr=lr, ...)")
        for name, value in defaults.items():
            if isinstance(value, (int, float)) and value < 0:
                raise ValueError(f"{type(self).__name__}: {name} must be >= 0, got {value}")
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self,  # type: ignore[override]  # the closure's loss is a tensor, not a float
             closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """Update every parameter that has a gradient; returns closure() if one is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse "
                                       f"gradients")
                state = self.state[p]
                state["step"] = state.get("step", 0) + 1
                self.update(p, p.grad, state, group)
        return loss

    def update(self, p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
               group: dict[str, Any]) -> None:
        """Change `p` in place from its gradient, its state and its group's hyperparameters."""
        raise NotImplementedError(f"{type(self).__name__} must implement "
                                  f"update(self, p, grad, state, group)")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two parameter groups, as GPT-2 and nanoGPT use them: matrices (weights of linear layers,
    embeddings) decay, while vectors (biases, LayerNorm gains and shifts) do not: shrinking
    them toward zero regularises nothing useful. Each parameter appears once."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]
