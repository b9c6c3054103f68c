"""Surviving a failure: a 3D-parallel run that checkpoints every few steps, and resumes.

A synchronous step cannot go on without one of its ranks: every collective waits for it
(module 4). What a run can do is lose little when a rank dies: `train` saves a checkpoint
(`checkpoint.save`, each rank its own shards) after every `every`-th step; once the cluster
has reported the dead rank and replaced its engines, `train(..., resume=True)` loads the run
folder's `latest` complete checkpoint, on the same layout or on another one (resharded), and
goes on from the step after it. The steps since that checkpoint are computed again, on the same
batches, so the loss curve is the one of a run that never failed.

    try:
        cluster.run(train, Layout(2, 1, 2), config, batches, run, every=2, crash=(3, 5))
    except RankFailure as failure:      # rank 3's engine process died before step 5
        print(failure.ranks)            # [3]
    resumed = cluster.run(train, Layout(1, 2, 2), config, batches, run, every=2, resume=True)

Each call returns, on every rank, a `Progress`: the losses of the steps it ran, and what the
checkpoints cost this rank (seconds to save and load, bytes written).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..comm.base import Communicator
from ..comm.torch_backend import TorchCommunicator
from ..models.gpt import GPTConfig
from .checkpoint import latest, load, save, shard_folder
from .model import Layout, ThreeD
from .step import three_d_step

CRASH_FILE = "crash.json"  # `crash` leaves the rank, the step and the wall-clock time here


@dataclass
class Progress:
    """One rank's share of a `train` call.

    losses: the global batch's mean loss by step, for the steps this call ran;
    start: the step it began at (0, or the step the checkpoint it loaded was saved after);
    load_seconds: reading the checkpoint (0.0 when it began afresh);
    save_seconds: each save, waiting for the other ranks' shards included;
    checkpoint_bytes: what this rank wrote in its last save (0 on dp replicas other than 0,
        which hold the same numbers as replica 0 and write nothing).
    """

    losses: dict[int, float] = field(default_factory=dict)
    start: int = 0
    load_seconds: float = 0.0
    save_seconds: list[float] = field(default_factory=list)
    checkpoint_bytes: int = 0


def train(comm: Communicator, layout: Layout, config: GPTConfig,
          batches: Sequence[tuple[torch.Tensor, torch.Tensor]], run: str | Path, *, every: int,
          m: int = 1, lr: float = 0.1, momentum: float = 0.9, seed: int = 0,
          dtype: torch.dtype = torch.float64, resume: bool = False,
          crash: tuple[int, int] | None = None) -> Progress:
    """Train the GPT `config` under `layout` with SGD on `batches` (step i's global batch,
    inputs and targets), m micro-batches per replica, to step len(batches); save into the
    folder `run` after every `every`-th step. Every rank calls it.

    resume: begin from the run's `latest` complete checkpoint (saved on any layout), or from
        step 0 if there is none;
    crash: (rank, step): that rank's process is killed (SIGKILL, as a crash or the out-of-
        memory killer ends it) just before that step, after writing `CRASH_FILE` into `run`
        with the time, so that the controller can time how long the detection took. On
        simulated ranks, which are threads of one process, the rank raises instead.
    """
    if every < 1:
        raise ValueError(f"every must be at least 1 step, got {every}")
    run = Path(run)
    three_d = ThreeD(comm, layout, config, seed=seed, dtype=dtype)
    optimizer = torch.optim.SGD(three_d.parameters(), lr=lr, momentum=momentum)
    progress = Progress()
    found = latest(run) if resume else None
    if found is not None:
        began = time.perf_counter()
        progress.start = load(three_d, optimizer, found)
        progress.load_seconds = time.perf_counter() - began
    for step in range(progress.start, len(batches)):
        if crash == (comm.rank, step):
            die(comm, run, step)
        progress.losses[step] = three_d_step(three_d, optimizer, *batches[step], m=m)
        if (step + 1) % every == 0:
            began = time.perf_counter()
            directory = save(three_d, optimizer, step + 1, run)
            progress.save_seconds.append(time.perf_counter() - began)
            progress.checkpoint_bytes = written(three_d, directory)
    return progress


def written(three_d: ThreeD, directory: Path) -> int:
    """The bytes this rank wrote into the checkpoint `directory` (its shards' folder)."""
    if three_d.mesh["dp"].rank != 0:
        return 0
    folder = shard_folder(directory, three_d.mesh["pp"].rank, three_d.mesh["tp"].rank)
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def die(comm: Communicator, run: Path, step: int) -> None:
    """End this rank as a crash would: its process killed, no exception, no goodbye."""
    run.mkdir(parents=True, exist_ok=True)
    record = {"rank": comm.rank, "step": step, "time": time.time()}
    (run / CRASH_FILE).write_text(json.dumps(record))
    if not isinstance(comm, TorchCommunicator):  # a simulated rank: the process is shared
        raise RuntimeError(f"rank {comm.rank} crashed before step {step}")
    os.kill(os.getpid(), signal.SIGKILL)


def crashed_at(run: str | Path) -> float | None:
    """When `crash` killed a rank of the run in `run` (time.time()), or None."""
    path = Path(run) / CRASH_FILE
    if not path.exists():
        return None
    when: float = json.loads(path.read_text())["time"]
    return when
