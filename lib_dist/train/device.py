"""Where to train: the first CUDA GPU when there is one, else the CPU."""

from __future__ import annotations

import torch


def pick_device(prefer: str | None = None) -> torch.device:
    """`torch.device("cuda")` if CUDA is available, else `torch.device("cpu")`.

    `prefer` ("cpu", "cuda", "cuda:1", ...) overrides the choice; asking for CUDA on a machine
    without it raises, rather than silently training somewhere else.
    """
    if prefer is not None:
        device = torch.device(prefer)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {prefer!r} requested, but CUDA is not available")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
