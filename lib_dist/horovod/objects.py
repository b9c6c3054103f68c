"""Moving Python objects and whole models between ranks: `broadcast_object`,
`allgather_object`, `broadcast_parameters`, `broadcast_optimizer_state`.

Objects travel pickled (with cloudpickle, so functions and classes defined in the script
travel too). Parameters and optimizer state travel as tensors, fused: one broadcast per dtype
rather than one per tensor, since a model has many small tensors and each collective costs a
round of latency.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import cloudpickle
import torch

from . import basics, negotiate, wire
from .ops import check_root, on_the_wire, start
from .process_sets import state_for


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = None) -> Any:
    """Rank `root_rank`'s `obj`, on every rank (a copy everywhere but on the root)."""
    s = state_for(process_set, "broadcast_object")
    root = check_root(s, root_rank, "broadcast_object")
    if s.comm.world_size == 1:
        return obj
    data = cloudpickle.dumps(obj) if s.comm.rank == root else None
    got: bytes = start(s, "BROADCAST", s.auto_name("broadcast_object", name),
                       dict(root=root_rank), len(data or b""),
                       lambda _: wire.broadcast_bytes(s.comm, data, root), lambda b: b, True)
    return obj if s.comm.rank == root else pickle.loads(got)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's `obj`, as a list by rank."""
    s = state_for(process_set, "allgather_object")
    if s.comm.world_size == 1:
        return [obj]
    data = cloudpickle.dumps(obj)
    got: list[bytes] = start(s, "ALLGATHER", s.auto_name("allgather_object", name), {},
                             len(data), lambda _: wire.all_gather_bytes(s.comm, data),
                             lambda b: b, True)
    return [obj if r == s.comm.rank else pickle.loads(b) for r, b in enumerate(got)]


def broadcast_parameters(params: Any, root_rank: int, process_set: Any = None) -> None:
    """Overwrite every rank's parameters with rank `root_rank`'s, in place.

    params: `model.state_dict()` (or any dict of tensors, taken in sorted key order, as
    Horovod does), `model.named_parameters()` / a list of (name, tensor) pairs, or a list of
    tensors. Every rank must pass the same structure.
    """
    s = state_for(process_set, "broadcast_parameters")
    check_root(s, root_rank, "broadcast_parameters")
    if isinstance(params, Mapping):
        named = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, Iterable) and not isinstance(params, torch.Tensor):
        named = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"broadcast_parameters: params must be a dict (model.state_dict()) or "
                         f"a list of (name, tensor) pairs, got {type(params).__name__}")
    for name, p in named:
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name or 'an entry'} is a "
                             f"{type(p).__name__}, not a tensor")
    broadcast_tensors([p for _, p in named], root_rank, "broadcast_parameters", process_set)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              process_set: Any = None) -> None:
    """Give every rank's `optimizer` the state and hyperparameters of rank `root_rank`'s.

    The root's `state_dict()` travels in two parts: its structure and every number in it
    (learning rates, step counts) as one pickle, and its tensors (momentum buffers, Adam's
    moments) as fused broadcasts into tensors of the same shapes. An optimizer that has not
    stepped yet has no state: as Horovod does, it first takes one step on zero gradients
    (every rank, so the state exists everywhere; a DistributedOptimizer steps without
    all-reducing), and one still without state after that (plain SGD) has nothing to send.
    """
    s = state_for(process_set, "broadcast_optimizer_state")
    root = check_root(s, root_rank, "broadcast_optimizer_state")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state: torch.optim.LBFGS's state cannot be "
                         "broadcast (its structure is nested with None values); broadcast "
                         "optimizer.state_dict() with hvd.broadcast_object instead")
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer)
    if s.comm.world_size == 1:
        return
    mine = optimizer.state_dict()
    tensors: list[torch.Tensor] = []
    skeleton = broadcast_object(_skeleton(mine, tensors) if s.comm.rank == root else None,
                                root_rank, "optimizer_state", process_set)
    if s.comm.rank != root:
        tensors = []
        _fill(skeleton, mine, tensors)
    broadcast_tensors(tensors, root_rank, "broadcast_optimizer_state", process_set)
    if s.comm.rank != root:
        optimizer.load_state_dict(_rebuild(skeleton, iter(tensors)))


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """One step on zero gradients, which makes the optimizer's state (Horovod's way)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    skip = getattr(optimizer, "skip_synchronize", None)  # a DistributedOptimizer's
    if skip is not None:
        with skip():
            optimizer.step()
    else:
        optimizer.step()


def broadcast_tensors(tensors: list[torch.Tensor], root_rank: int, what: str,
                      process_set: Any = None) -> None:
    """Overwrite `tensors` with the root's, in place: one broadcast per dtype."""
    s = state_for(process_set, what)
    root = check_root(s, root_rank, what)
    if s.comm.world_size == 1:
        return
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t.detach())
    for dtype, group in groups.items():
        flat = torch.cat([t.reshape(-1).to(s.comm.device) for t in group])
        if flat.numel() == 0:
            continue

        def run(_: list[Any], flat: torch.Tensor = flat) -> None:
            with on_the_wire(flat) as sent:
                s.comm.broadcast(sent, root)

        start(s, "BROADCAST", f"{what} {str(dtype).replace('torch.', '')}",
              negotiate.signature(flat, root=root_rank), flat.nbytes, run, lambda _: None, True)
        offset = 0
        for t in group:
            t.copy_(flat[offset: offset + t.numel()].view_as(t))
            offset += t.numel()


class _TensorSlot:
    """Where a tensor was in a state dict: its shape and dtype (the values travel apart)."""

    def __init__(self, t: torch.Tensor):
        self.shape, self.dtype = tuple(t.shape), t.dtype


def _skeleton(value: Any, tensors: list[torch.Tensor]) -> Any:
    """`value` with every tensor replaced by a `_TensorSlot`, the tensors appended to
    `tensors` in the order they were met."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _TensorSlot(value)
    if isinstance(value, dict):
        return {k: _skeleton(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_skeleton(v, tensors) for v in value)
    return value


def _fill(skeleton: Any, mine: Any, tensors: list[torch.Tensor]) -> None:
    """Tensors to receive into, for each slot of `skeleton` in order: this rank's own tensor
    where it has one of the same shape and dtype, else a new one."""
    if isinstance(skeleton, _TensorSlot):
        if (isinstance(mine, torch.Tensor) and tuple(mine.shape) == skeleton.shape
                and mine.dtype == skeleton.dtype):
            tensors.append(mine.detach().clone())
        else:
            tensors.append(torch.empty(skeleton.shape, dtype=skeleton.dtype))
    elif isinstance(skeleton, dict):
        for k, v in skeleton.items():
            _fill(v, mine.get(k) if isinstance(mine, dict) else None, tensors)
    elif isinstance(skeleton, (list, tuple)):
        for i, v in enumerate(skeleton):
            own = mine[i] if isinstance(mine, (list, tuple)) and i < len(mine) else None
            _fill(v, own, tensors)


def _rebuild(skeleton: Any, tensors: Any) -> Any:
    if isinstance(skeleton, _TensorSlot):
        return next(tensors)
    if isinstance(skeleton, dict):
        return {k: _rebuild(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_rebuild(v, tensors) for v in skeleton)
    return skeleton
