"""GradScaler's kernels, guarded where every route to them meets: torch's dispatcher.

`oracles` guards a function oracle by rebinding it where it is defined. A kernel of torch has
other names that cannot be rebound: `torch.ops.aten._amp_update_scale_` and
`torch._C._VariableFunctions._amp_update_scale_` reach the same C++ kernel without passing
through `torch._amp_update_scale_`. Every one of them goes through the dispatcher, so the
guard registers its own CPU and CUDA kernels there (`torch.library`): each refuses inside an
answer and otherwise computes what torch's kernel computes, in the same arithmetic
(`tests/test_integrity_kernels.py` holds them to torch's own, bit for bit).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

_libraries: list[Any] = []  # a Library unregisters its kernels when it is collected


def update_scale(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor,
                 growth_factor: float, backoff_factor: float,
                 growth_interval: int) -> torch.Tensor:
    """`torch._amp_update_scale_`: back off after an overflow, grow after `growth_interval`
    steps without one (unless growing overflows float32)."""
    current = float(scale)  # float32, exactly; products below in float64, then rounded once
    if float(found_inf):
        scale.fill_(current * backoff_factor)
        growth_tracker.zero_()
        return scale
    successful = int(growth_tracker) + 1
    if successful == growth_interval:
        grown = torch.tensor(current * growth_factor, dtype=torch.float32)
        if torch.isfinite(grown):
            scale.copy_(grown)
        growth_tracker.zero_()
    else:
        growth_tracker.fill_(successful)
    return scale


def unscale(grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """`torch._amp_foreach_non_finite_check_and_unscale_`: note any non-finite gradient in
    `found_inf`, and multiply every gradient by `inv_scale` in place (in float32 at least, as
    torch's kernel computes half precision)."""
    factor = float(inv_scale)  # a Python number: CUDA would round a GPU tensor to fp16 first
    for grad in grads:
        if not bool(torch.isfinite(grad).all()):
            found_inf.fill_(1.0)
        if factor != 1.0:
            grad.mul_(factor)


KERNELS: dict[str, Callable[..., Any]] = {
    "_amp_update_scale_": update_scale,
    "_amp_foreach_non_finite_check_and_unscale_": unscale,
}


def guard_kernel(name: str, refuse: Callable[[], None]) -> bool:
    """Put a refusing twin of aten's `name` in front of torch's own kernel, on CPU and CUDA;
    whether `name` is one this module knows."""
    compute = KERNELS.get(name)
    if compute is None:
        return False

    def kernel(*args: Any) -> Any:
        refuse()
        return compute(*args)

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point
        warnings.simplefilter("ignore")
        for key in ("CPU", "CUDA"):
            library.impl(name, kernel, key)
    _libraries.append(library)
    return True


__all__ = ["KERNELS", "guard_kernel", "unscale", "update_scale"]
