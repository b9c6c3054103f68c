"""ZeRO stage 3 / FSDP: parameters sharded too, gathered one unit at a time when needed.

Stages 1 and 2 still give every rank every parameter. Stage 3 keeps, on rank r, only chunk r of
each unit's flattened parameters (a unit: a transformer block, say; whatever is in no unit
belongs to the root). A unit's full parameters exist only while it computes:

- forward: just before the unit runs, all-gather its chunks into the full flat vector and
  point the unit's parameter names at views of it; just after, drop them (freed);
- backward: autograd needs some of those parameters again (a matmul's gradient with respect to
  its input needs the weight). What autograd saves of a gathered parameter is not the tensor
  but where it was (a `saved_tensors_hooks` pack); when backward reaches the unit, the first
  unpack all-gathers the unit again, and the gathered copy lives until the unit's gradients
  are done;
- the full gradient of the unit's flat vector is reduce-scattered (averaged): rank r keeps the
  gradient of its chunk, which the optimizer steps. The gathering is one autograd Function
  (`Gathered`): all-gather forward, reduce-scatter backward.

Traffic per step per rank: all-gather forward, all-gather again in backward, reduce-scatter of
the gradients: 3 x (N - 1) / N x P numbers, against 2 for stages 1-2. Memory: P / N of
parameters, gradients and optimizer state, plus the largest unit gathered (or two, with the
root).

With `prefetch=True` the next unit's all-gather travels while the current unit computes
(`lib_dist.sharding.prefetch`), at the cost of a second gathered unit in memory.

    sharded = FSDP(model, comm, units=list(model.blocks))  # units must not nest
    optimizer = torch.optim.AdamW(sharded.parameters())   # its parameters: the shards
    loss(sharded(x), y).backward(); optimizer.step()
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..comm import Communicator
from ..mixed_precision.zero import padded_flat
from .prefetch import Prefetcher


class Gathered(torch.autograd.Function):
    """forward: the unit's full flat parameters from every rank's chunk (all-gather);
    backward: this rank's chunk of the average gradient (reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, chunk: torch.Tensor, unit: Unit) -> torch.Tensor:
        ctx.unit = unit
        return unit.gather(chunk.detach())

    @staticmethod
    def backward(ctx: Any, grad_full: torch.Tensor) -> tuple[torch.Tensor, None]:
        unit: Unit = ctx.unit
        unit.regathered = None  # its backward is done: the second gathered copy goes
        if unit.prefetcher is not None:
            unit.prefetcher.settle()  # the previous unit's gather, before this collective
        return unit.comm.reduce_scatter(grad_full.contiguous(), op="avg"), None


class Unit:
    """A module's own parameters (those no inner unit owns), flattened and sharded."""

    def __init__(self, module: nn.Module, slots: list[tuple[nn.Module, str, int]],
                 params: list[nn.Parameter], comm: Communicator):
        self.module, self.comm = module, comm
        self.shapes = [p.shape for p in params]
        self.slots = slots  # (module, attribute name, index into params) of each use
        self.numel = sum(p.numel() for p in params)
        self.chunk_size = -(-self.numel // comm.world_size)
        flat = padded_flat([p.detach() for p in params], comm.world_size)
        start = comm.rank * self.chunk_size
        self.shard = nn.Parameter(flat[start:start + self.chunk_size].clone())
        self.gathered: torch.Tensor | None = None  # during its forward
        self.regathered: torch.Tensor | None = None  # during its backward
        self.prefetcher: Prefetcher | None = None  # FSDP's, when it prefetches

    def gather(self, chunk: torch.Tensor) -> torch.Tensor:
        """All-gather every rank's chunk: the full flat vector, padding included (taken
        from the prefetcher when it fetched this unit already)."""
        if self.prefetcher is not None:
            flat = self.prefetcher.take(self)
            if flat is not None:
                return flat
            self.prefetcher.settle()
        return torch.cat(self.comm.all_gather(chunk.contiguous()))

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view of the full flat vector `flat`, shaped as it was."""
        sizes = [shape.numel() for shape in self.shapes]
        pieces = flat[:self.numel].split(sizes)
        return [piece.view(shape) for piece, shape in zip(pieces, self.shapes)]

    def bind(self, flat: torch.Tensor) -> None:
        """Point each use of each parameter at its view of `flat`."""
        views = self.views(flat)
        for module, name, index in self.slots:
            setattr(module, name, views[index])

    def unbind(self) -> None:
        for module, name, _ in self.slots:
            setattr(module, name, None)

    def saved_again(self) -> torch.Tensor:
        """The full flat vector for backward: gathered once more, then kept until the unit's
        gradient has been reduce-scattered."""
        if self.regathered is None:
            with torch.no_grad():
                self.regathered = self.gather(self.shard.detach())
        return self.regathered


class FSDP(nn.Module):
    """`module` with its parameters sharded over `comm`'s ranks, unit by unit (`units`: its
    submodules gathered one at a time, in the order the forward pass runs them, e.g. a GPT's
    blocks; the rest is the root unit). `prefetch`: gather the next unit while one computes."""

    def __init__(self, module: nn.Module, comm: Communicator,
                 units: Iterable[nn.Module] = (), prefetch: bool = False):
        super().__init__()
        self.module = module
        inner = list(units)
        _refuse_shared(module, inner)
        self.inner = [u for u in (_shard(unit, comm) for unit in inner) if u.numel]
        root = _shard(module, comm, skip=inner)
        self.root = root if root.numel else None
        self.units = self.inner + ([root] if root.numel else [])  # all shards, root last
        self._shards = nn.ParameterList([u.shard for u in self.units])
        self.prefetcher = Prefetcher() if prefetch else None
        for unit in self.units:
            unit.prefetcher = self.prefetcher
        for k, unit in enumerate(self.inner):
            unit.module.register_forward_pre_hook(self._before(k))
            unit.module.register_forward_hook(self._after(unit))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.prefetcher is not None:
            self.prefetcher.clear()  # a new pass: what was fetched before may be stale
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            if self.root is not None:
                self._gather(self.root)
            if self.prefetcher is not None and self.inner:
                self.prefetcher.start(self.inner[0])
            try:
                return self.module(*args, **kwargs)
            finally:
                if self.root is not None:
                    self._release(self.root)

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole, under its name in the wrapped module (a collective: every
        rank calls it; a tied parameter under each of its names)."""
        names = {id(m): name for name, m in self.module.named_modules()}
        if self.prefetcher is not None:
            self.prefetcher.clear()
        state = {}
        for unit in self.units:
            views = unit.views(unit.gather(unit.shard.detach()))
            for module, attribute, index in unit.slots:
                prefix = names[id(module)]
                state[f"{prefix}.{attribute}" if prefix else attribute] = views[index].clone()
        return state

    def _before(self, k: int) -> Any:
        def gather_unit(module: nn.Module, args: Any) -> None:
            self._gather(self.inner[k])
            if self.prefetcher is not None and k + 1 < len(self.inner):
                self.prefetcher.start(self.inner[k + 1])  # travels while unit k computes
        return gather_unit

    def _after(self, unit: Unit) -> Any:
        return lambda module, args, output: self._release(unit)

    def _gather(self, unit: Unit) -> None:
        unit.gathered = Gathered.apply(unit.shard, unit)
        unit.bind(unit.gathered)

    @staticmethod
    def _release(unit: Unit) -> None:
        unit.unbind()
        unit.gathered = None

    def _pack(self, tensor: torch.Tensor) -> Any:
        """What autograd keeps of a saved tensor: for a view of a gathered unit, where it
        was, not the tensor (which would keep the whole unit gathered until backward)."""
        for index, unit in enumerate(self.units):
            if unit.gathered is not None and _same_storage(tensor, unit.gathered):
                return index, tensor.storage_offset(), tensor.shape, tensor.stride()
        return tensor

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        index, offset, shape, stride = packed
        unit = self.units[index]
        first = unit.regathered is None
        flat = unit.saved_again()
        if first and self.prefetcher is not None and index > 0:
            # backward meets the units in reverse, the root (last in `units`) first
            self.prefetcher.start(self.units[index - 1])
        return flat.as_strided(shape, stride, offset)


def _shard(module: nn.Module, comm: Communicator, skip: Iterable[nn.Module] = ()) -> Unit:
    """`module`'s parameters, except those inside `skip`'s modules, taken out of their modules
    and sharded into a Unit (a parameter used in two places, like tied embeddings, once)."""
    inside_skip = {id(m) for s in skip for m in s.modules()}
    index_of: dict[int, int] = {}  # id of a parameter -> its index in `params`
    params: list[nn.Parameter] = []
    slots: list[tuple[nn.Module, str, int]] = []
    for owner in module.modules():
        if id(owner) in inside_skip:
            continue
        for name, p in list(owner._parameters.items()):
            if p is not None:
                if id(p) not in index_of:
                    index_of[id(p)] = len(params)
                    params.append(p)
                slots.append((owner, name, index_of[id(p)]))
    unit = Unit(module, slots, params, comm)
    for owner, name, _ in slots:
        del owner._parameters[name]
        setattr(owner, name, None)
    return unit


def _refuse_shared(root: nn.Module, units: list[nn.Module]) -> None:
    """A parameter one unit shards must not be used outside it: the other user would see a
    copy that no one updates (tied embeddings split between two units, the classic case)."""
    users: dict[int, list[str]] = {}
    inside = {id(m) for unit in units for m in unit.modules()}
    for i, unit in enumerate(units):
        for p in {id(q) for q in unit.parameters()}:
            users.setdefault(p, []).append(f"unit {i} ({type(unit).__name__})")
    for owner in root.modules():
        if id(owner) not in inside:
            for q in owner._parameters.values():
                if q is not None and id(q) in users:
                    users[id(q)].append(f"{type(owner).__name__} outside every unit")
    for names in users.values():
        if len(set(names)) > 1:
            raise ValueError(f"a parameter is used by {' and by '.join(sorted(set(names)))} "
                             f"(tied weights?); a unit shards its parameters, so put every "
                             f"module using one parameter in the same unit, or leave them all "
                             f"to the root")


def torch_fully_sharded(module: nn.Module, units: Iterable[nn.Module], world_size: int,
                        device_type: str = "cpu") -> nn.Module:
    """The oracle: `module` under torch's FSDP2, `fully_shard` on each unit and then on the
    root, over a device mesh of `world_size` ranks (torch.distributed initialised; "cuda"
    with NCCL, the module already on the rank's GPU)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (world_size,))
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


__all__ = ["FSDP", "Gathered", "Unit", "torch_fully_sharded"]
