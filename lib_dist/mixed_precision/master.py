"""fp32 master weights: the optimizer steps full-precision copies of half-precision parameters.

A model held in fp16 (or bf16) computes fast and stores half the bytes, but its weights cannot
take small updates: fp16 carries 11 significant bits, so adding an update smaller than half the
spacing between numbers near a weight (half an ulp) leaves the weight unchanged, and training
stagnates. `MasterWeights` keeps an fp32 copy of every parameter, gives each copy the
parameter's gradient as soon as backward has computed it (added, in fp32, to the copy's
gradient, and the half-precision gradient freed), steps an ordinary optimizer on the copies, and
writes them back, rounded, into the model. The small updates
accumulate in fp32 until they move the rounded weight.

It is used where a `torch.optim` optimizer is: `zero_grad()`, `step()`, `param_groups` (the
master copies', so a loss scaler unscales the fp32 gradients), `state_dict()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class MasterWeights:
    """`optimizer_class(masters, **hyperparameters)` over fp32 copies of `params`."""

    def __init__(self, params: Iterable[torch.Tensor],
                 optimizer_class: Callable[..., torch.optim.Optimizer], **hyperparameters: Any):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("MasterWeights got no parameter that requires a gradient")
        self.masters = [p.detach().float().clone().requires_grad_() for p in self.params]
        self.optimizer = optimizer_class(self.masters, **hyperparameters)
        self._hooks = [p.register_post_accumulate_grad_hook(self._copier(master))
                       for p, master in zip(self.params, self.masters)]

    @staticmethod
    def _copier(master: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def move_gradient(p: torch.Tensor) -> None:
            if p.grad is None:
                return
            if master.grad is None:
                master.grad = p.grad.float()
            else:
                master.grad += p.grad
            p.grad = None
        return move_gradient

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's groups, of the fp32 master copies."""
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients and the masters'."""
        clear_gradients(self.params, set_to_none)
        self.optimizer.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        """Step the masters, then copy them, rounded, into the model's parameters."""
        self.optimizer.step()
        for p, master in zip(self.params, self.masters):
            p.copy_(master)

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state and the master copies."""
        return {"optimizer": self.optimizer.state_dict(),
                "masters": [m.detach().clone() for m in self.masters]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for p, master, saved in zip(self.params, self.masters, state["masters"]):
                master.copy_(saved)
                p.copy_(saved)

    def remove_hooks(self) -> None:
        """Stop copying gradients (the model is about to be used without this optimizer)."""
        for hook in self._hooks:
            hook.remove()


def clear_gradients(params: Iterable[torch.Tensor], set_to_none: bool = True) -> None:
    """Each parameter's gradient set to None (or zeroed), as `Optimizer.zero_grad` does."""
    for p in params:
        if set_to_none:
            p.grad = None
        elif p.grad is not None:
            p.grad.zero_()
