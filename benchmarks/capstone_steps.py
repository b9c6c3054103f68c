"""What each of the capstone benchmark's 8 ranks times: one layout's training step under
lib_dist and under torch's composition, interleaved, each round after a calibration, and a
checkpoint's save and load under `lib_dist.three_d.checkpoint` and under
`torch.distributed.checkpoint` called directly on the same tensors.

Sent to the engines by value (cloudpickle), as `rounds.py` is.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle

from capstone_calibrate import all_reduce_groups, calibrate
from capstone_torch import torch_composition
from rounds import interleaved

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LR = 1e-3


def global_batch(config: Any, size: int, seed: int = 1) -> tuple[Any, Any]:
    """`size` random sequences of the model's context, and their next tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(config.vocab_size, (size, config.block_size + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def layout_steps(comm: Any, config: Any, shape: tuple[int, int, int], batch: int,
                 micro_batch: int, rounds: int, steps: int, repeats: int) -> dict[str, Any]:
    """This rank's seconds per step of lib_dist's `three_d_step` (AdamW) and of torch's
    composition, by round (after one step each to warm up), each round opened by a
    calibration of the machine (`calibrate`, `repeats` of each measurement), so that every
    round's steps have a prediction from that moment's machine; and each one's last loss."""
    import torch

    from lib_dist.three_d import Layout, ThreeD, three_d_step

    torch.set_num_threads(1)
    m = batch // (shape[0] * micro_batch)
    x, y = global_batch(config, batch)
    three_d = ThreeD(comm, Layout(*shape), config, seed=0)
    optimizer = torch.optim.AdamW(three_d.parameters(), lr=LR)
    losses: dict[str, Any] = {}

    def ours() -> None:
        losses["lib_dist"] = three_d_step(three_d, optimizer, x, y, m)

    theirs_step, _ = torch_composition(config, shape, m, micro_batch)

    def theirs() -> None:
        losses["torch"] = theirs_step(x, y)
    calls = {"lib_dist": ours, "torch": theirs}
    for call in calls.values():
        call()
    groups = all_reduce_groups(comm)
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    calibrations = []
    for r in range(rounds):
        calibrations.append(calibrate(comm, config, micro_batch, repeats, groups))
        order = dict(reversed(calls.items())) if r % 2 else calls
        for name, each in interleaved(comm, order, 1, steps)[0].items():
            seconds[name] += each
    return {"seconds": seconds, "losses": losses, "calibrations": calibrations}


def checkpoint_times(comm: Any, config: Any, shape: tuple[int, int, int], batch: int,
                     micro_batch: int, rounds: int, folder: str) -> dict[str, list[float]]:
    """This rank's seconds to save and to load one checkpoint, by round: lib_dist's `save` /
    `load` against `dcp.save` / `dcp.load` of the same tensors (each (pp, tp) rank of replica
    0 its own shards, in a folder of its own; every rank waits at a barrier after each)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from lib_dist.three_d import Layout, ThreeD, three_d_step
    from lib_dist.three_d import checkpoint

    torch.set_num_threads(1)
    three_d = ThreeD(comm, Layout(*shape), config, seed=0)
    optimizer = torch.optim.AdamW(three_d.parameters(), lr=LR)
    m = batch // (shape[0] * micro_batch)
    three_d_step(three_d, optimizer, *global_batch(config, batch), m)  # the optimizer's state
    mesh, root = three_d.mesh, Path(folder)
    state: dict[str, torch.Tensor] = {"step": torch.tensor(1)}
    for key, (p, _) in checkpoint.shards(three_d).items():
        state[key] = p.detach()
        for name, value in optimizer.state.get(p, {}).items():
            state[f"{key}/{name}"] = value
    writer = mesh["dp"].rank == 0

    def direct(r: int) -> Path:
        return root / "dcp" / str(r) / f"pp{mesh['pp'].rank}_tp{mesh['tp'].rank}"

    def timed(fn: Any) -> float:
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - start

    out: dict[str, list[float]] = {k: [] for k in ("lib_dist save", "dcp save",
                                                   "lib_dist load", "dcp load")}
    for r in range(rounds):
        out["lib_dist save"].append(timed(lambda: checkpoint.save(three_d, optimizer, r,
                                                                  root / "lib_dist")))
        with checkpoint.alone():
            out["dcp save"].append(timed(lambda: writer and dcp.save(
                state, checkpoint_id=direct(r), no_dist=True)))
            out["dcp load"].append(timed(lambda: dcp.load(  # every replica reads replica 0's
                state, checkpoint_id=direct(r), no_dist=True)))
        out["lib_dist load"].append(timed(lambda: checkpoint.load(
            three_d, optimizer, root / "lib_dist" / f"step{r}")))
    return out
