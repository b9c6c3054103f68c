"""What the rows of benchmarks/gpu_check.py share: the table's registry (`check`, `Skip`,
`CHECKS`) and the small GPT and batch the rows train, on a device. The engines get these by
value (cloudpickle), since they cannot import the benchmarks folder."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import cloudpickle
import torch

class Skip(Exception):
    """A row that cannot run here; its message says why."""


CHECKS: dict[str, tuple[str, Callable[[argparse.Namespace, dict], str], bool, bool]] = {}


def check(name: str, what: str, cuda: bool = True, cluster: bool = True) -> Callable:
    """A row, `fn(args, shared) -> result`, raising to fail; needs a GPU? ipyparallel?"""
    def register(fn: Callable[[argparse.Namespace, dict], str]) -> Callable:
        CHECKS[name] = (what, fn, cuda, cluster)
        return fn
    return register


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def backend_and_device(comm: Any) -> tuple[str, str]:
    return comm.backend, str(comm.device)


def small_gpt(device: str) -> Any:
    from lib_dist.models import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=64)).to(device)


def batch(device: str, rows: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 96, (2, rows, 64), generator=generator).to(device)
    return x, y


def assert_adamw_close(got: dict[Any, torch.Tensor], want: dict[Any, torch.Tensor], steps: int,
                       lr: float) -> int:
    """Per-tensor AdamW against a flat or sharded one after `steps` steps: the same elementwise
    arithmetic, at most a few roundings (moments, ratio, update) a step, each within eps of
    |p| + lr. Returns how many tensors agree bit for bit."""
    eps = torch.finfo(torch.float32).eps
    for name, b in want.items():
        assert ((got[name] - b).abs() <= steps * 4 * eps * (b.abs() + lr)).all(), (
            f"parameter {name} differs")
    return sum(torch.equal(got[name], b) for name, b in want.items())


def needs_cluster(shared: dict) -> Any:
    if "cluster" not in shared:
        raise Skip("the 'cuda first' row did not start the cluster")
    return shared["cluster"]


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the engines cannot import this
