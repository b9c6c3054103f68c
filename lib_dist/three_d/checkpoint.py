"""Checkpoints of a 3D-parallel run with `torch.distributed.checkpoint`, loadable on another
layout.

Saving after step n, into `step{n}/` of the run's folder: the ranks of dp replica 0 write
their own shards, each (pp, tp) rank into its own DCP checkpoint (`pp{p}_tp{t}/`), as
`layers.{i}.{name}` for layer i of the whole model, with the optimizer's state of each
parameter beside it (`.../{state name}`); the other replicas hold the same numbers. Once
every shard is written, rank 0 writes the layout and the stages' bounds (`layout.json`): a
checkpoint without it is incomplete (a rank died while saving) and `latest` passes it over.

Loading, on any layout of the same model: each rank finds, for each of its parameters, the old
stage that held its layer, reads that layer's shards from every old tp rank, puts the full
tensor back together (`unshard`) and cuts its own share for the new tp (`piece_of`). A tensor
that tensor parallelism keeps whole (LayerNorms, a row-parallel bias, a step count) is read
from old tp rank 0.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, piece_of, unshard
from .model import Layout, ThreeD

Split = tuple[int, int] | None  # (dim, parts) a parameter is cut along by tp, or None: whole


def split_of(layer: nn.Module) -> dict[str, Split]:
    """How tensor parallelism cuts each of `layer`'s parameters, by name."""
    out: dict[str, Split] = {}
    for prefix, module in layer.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            split: Split = None
            if _is(module, ColumnParallelLinear):
                # a student's own layer (lab06) has no `parts`: its fused qkv is in 3 blocks
                split = (0, getattr(module, "parts", 3 if prefix.endswith("qkv") else 1))
            elif _is(module, RowParallelLinear) and name == "weight":
                split = (1, 1)
            out[f"{prefix}.{name}".lstrip(".")] = split
    return out


def _is(module: nn.Module, kind: type) -> bool:
    """`module` is lib_dist's `kind`, or a student's class of that name (lab06's, registered
    through `lib_dist.registry`: the pieces of their ParallelAttention and ParallelMLP)."""
    return isinstance(module, kind) or type(module).__name__ == kind.__name__


def shards(three_d: ThreeD) -> dict[str, tuple[nn.Parameter, Split]]:
    """This rank's parameters under their names in the whole model, with their split."""
    first = three_d.bounds[three_d.mesh["pp"].rank][0]
    out = {}
    for i, layer in enumerate(three_d.layers):
        splits = split_of(layer)
        for name, p in layer.named_parameters():
            out[f"layers.{first + i}.{name}"] = (p, splits[name])
    return out


def save(three_d: ThreeD, optimizer: torch.optim.Optimizer, step: int, run: Path) -> Path:
    """Write the run's state after `step` steps into `run`/step{step} (every rank calls it)."""
    mesh = three_d.mesh
    directory = Path(run) / f"step{step}"
    if mesh["dp"].rank == 0:
        state: dict[str, torch.Tensor] = {"step": torch.tensor(step)}
        for key, (p, _) in shards(three_d).items():
            state[key] = p.detach()
            for name, value in optimizer.state.get(p, {}).items():
                state[f"{key}/{name}"] = value
        with alone():
            _dcp().save(state, checkpoint_id=shard_folder(directory, mesh["pp"].rank,
                                                       mesh["tp"].rank), no_dist=True)
    mesh.comm.barrier()  # every shard is on disk
    if mesh.comm.rank == 0:  # the checkpoint is complete
        layout = vars(three_d.layout) | {"bounds": three_d.bounds}
        (directory / "layout.json").write_text(json.dumps(layout))
    mesh.comm.barrier()
    return directory


def latest(run: Path) -> Path | None:
    """The run's last complete checkpoint, or None."""
    done = [d for d in Path(run).glob("step*") if (d / "layout.json").exists()]
    return max(done, key=lambda d: int(d.name.removeprefix("step")), default=None)


def shard_folder(directory: Path, pp: int, tp: int) -> Path:
    return Path(directory) / f"pp{pp}_tp{tp}"


def load(three_d: ThreeD, optimizer: torch.optim.Optimizer, directory: Path) -> int:
    """Load the checkpoint in `directory` (`save`'s), saved on any layout of this model, into
    this rank's parameters and `optimizer`'s state; returns the steps it was saved after."""
    saved = json.loads((Path(directory) / "layout.json").read_text())
    old_tp = Layout(saved["dp"], saved["pp"], saved["tp"]).tp
    mine = shards(three_d)
    wanted: dict[Path, list[str]] = {}  # old rank's folder -> the keys this rank reads there
    for key, (_, split) in mine.items():
        layer = int(key.split(".")[1])
        stage = next(s for s, (a, b) in enumerate(saved["bounds"]) if a <= layer < b)
        for t in range(old_tp if split else 1):
            wanted.setdefault(shard_folder(directory, stage, t), []).append(key)
    found = {folder: _read_prefixed(folder, keys) for folder, keys in wanted.items()}
    tp = three_d.mesh["tp"]
    for key, (p, split) in mine.items():
        pieces = [found[folder][key] for folder, keys in wanted.items() if key in keys]
        for name, full in _whole(pieces, split).items():  # pieces in old tp rank order
            share = full if split is None or full.dim() == 0 else piece_of(
                full, tp.rank, tp.world_size, *split)
            if name == "":
                with torch.no_grad():
                    p.copy_(share)
            else:
                optimizer.state[p][name] = share
    return int(_read(shard_folder(directory, 0, 0), ["step"])["step"])


def _read_prefixed(folder: Path, keys: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Each parameter of `keys` and its optimizer state ("" and each state's name) from the
    checkpoint in `folder`, in one read."""
    every = _dcp().FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    names = [k for k in every if k.split("/")[0] in set(keys)]
    tensors = _read(folder, names)
    out: dict[str, dict[str, torch.Tensor]] = {key: {} for key in keys}
    for name, t in tensors.items():
        key, _, state = name.partition("/")
        out[key][state] = t
    return out


def _whole(pieces: list[dict[str, torch.Tensor]], split: Split) -> dict[str, torch.Tensor]:
    """Each tensor put back together from the old tp ranks' shards (scalars: rank 0's)."""
    if split is None:
        return pieces[0]
    return {name: t if t.dim() == 0 else unshard([p[name] for p in pieces], *split)
            for name, t in pieces[0].items()}


def _read(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors `names` of the DCP checkpoint in `folder`."""
    meta = _dcp().FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    state = {k: torch.empty(tuple(meta[k].size), dtype=meta[k].properties.dtype)
             for k in names}
    with alone():
        _dcp().load(state, checkpoint_id=str(folder), no_dist=True)
    return state


def _dcp() -> Any:
    """torch.distributed.checkpoint, imported where it is used: importing it takes over a
    second (it brings DTensor, FSDP and sympy), which every graded lab's judge would pay, as it
    imports all of lib_dist (lab11 preloads it)."""
    import torch.distributed.checkpoint as dcp

    return dcp


@contextmanager
def alone() -> Iterator[None]:
    """Each rank reads and writes its own checkpoints (`no_dist`), whatever process group
    there is: DCP's warning that it assumes so is expected, not news."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield
