"""Save training and resume it exactly where it stopped.

Resuming needs more than the weights: the optimizer's state (momentum, Adam's moments and step
counts), the position in the stream of batches, the step number, and the random number
generator (for dropout). A checkpoint holds all of them. `torch.load(..., weights_only=True)`
reads it back, so loading a checkpoint runs no code from the file.
"""

from __future__ import annotations

import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn


def save_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
                    = None, step: int = 0, batches: Any = None, **extra: Any) -> Path:
    """Write the training state to `path`, atomically (a crash mid-write leaves the previous
    checkpoint intact). `batches` is anything with `state_dict()`, such as `TokenBatches`;
    `extra` holds plain values (numbers, strings, lists, dicts) to keep alongside."""
    path = Path(path)
    config = getattr(model, "config", None)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "step": step,
        "batches": batches.state_dict() if batches is not None else None,
        "rng": torch.get_rng_state(),
        "config": asdict(config) if is_dataclass(config) and not isinstance(config, type) else None,
        "extra": extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None
                    = None, batches: Any = None, map_location: str | torch.device = "cpu"
                    ) -> dict[str, Any]:
    """Restore what `save_checkpoint` wrote into `model` (and `optimizer`, `batches`, the RNG,
    when given). Returns the checkpoint, whose "step" is where training resumes."""
    state = torch.load(path, map_location=map_location, weights_only=True)
    model.load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise ValueError(f"{path} has no optimizer state to restore")
        optimizer.load_state_dict(state["optimizer"])
    if batches is not None:
        if state["batches"] is None:
            raise ValueError(f"{path} has no batch-stream state to restore")
        batches.load_state_dict(state["batches"])
    torch.set_rng_state(state["rng"])
    return state
