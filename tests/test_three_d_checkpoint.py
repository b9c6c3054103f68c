"""Surviving a failure in 3D parallelism (lib_dist.three_d.checkpoint), on simulated worlds of
8 ranks: a run at (dp=2, pp=2, tp=2) checkpoints with torch.distributed.checkpoint, each rank
its own shards; a rank dies mid-run and the world says which (no hang); a new world loads the
last checkpoint, on the same layout or another (pipeline and tensor parallelism cut
differently: resharded), and goes on with the loss curve of a run that never failed, in
float64, the optimizer's momentum carried over."""

from __future__ import annotations

import pytest
import torch

from lib_dist.comm import SimulatedWorld
from lib_dist.errors import RankFailure
from lib_dist.three_d import Layout, ThreeD, three_d_step
from lib_dist.three_d.checkpoint import latest, load, save
from lib_dist.three_d.resume import crashed_at
from lib_dist.three_d.resume import train as train_resumable

from test_three_d import CONFIG, LR, batches, one_process

STEPS, BATCHES, EVERY, VICTIM, DIES_AT = 6, 3, 2, 5, 5
EPS64 = torch.finfo(torch.float64).eps


def train(comm, layout: Layout, run, resume: bool, dies_at: int | None):
    """Steps from the run's last checkpoint (or from the start) to STEPS, saving every EVERY
    steps; rank VICTIM dies before step `dies_at`. The losses by step."""
    three_d = ThreeD(comm, layout, CONFIG, seed=0, dtype=torch.float64)
    optimizer = torch.optim.SGD(three_d.parameters(), lr=LR, momentum=0.9)
    start = load(three_d, optimizer, latest(run)) if resume else 0
    losses = {}
    for step in range(start, STEPS):
        if step == dies_at and comm.rank == VICTIM:
            raise RuntimeError("this rank's engine was killed")
        losses[step] = three_d_step(three_d, optimizer, *batches(step, BATCHES), m=1)
        if (step + 1) % EVERY == 0:
            save(three_d, optimizer, step + 1, run)
    return losses


@pytest.mark.parametrize("after", [(2, 2, 2), (4, 1, 2), (1, 2, 4)])
def test_a_run_that_loses_a_rank_resumes_from_its_checkpoint_on_any_layout(after, tmp_path):
    want = one_process(STEPS, BATCHES)
    with pytest.raises(RankFailure) as failed:
        SimulatedWorld(8, timeout=20).run(train, Layout(2, 2, 2), tmp_path, False, DIES_AT)
    assert failed.value.ranks == [VICTIM], failed.value  # the rank that died, named
    assert "this rank's engine was killed" in str(failed.value.exceptions[VICTIM])
    assert latest(tmp_path) == tmp_path / "step4"
    assert sorted(p.name for p in (tmp_path / "step4").iterdir()) == [
        "layout.json", "pp0_tp0", "pp0_tp1", "pp1_tp0", "pp1_tp1"]  # dp replica 0's shards
    resumed = SimulatedWorld(8, timeout=20).run(train, Layout(*after), tmp_path, True, None)
    for rank, losses in enumerate(resumed):
        assert sorted(losses) == [4, 5]  # from the last checkpoint, after step 4
        for step, loss in losses.items():
            assert abs(loss - want[step]) <= 1e4 * EPS64, (after, rank, step, loss, want[step])


def test_resume_train_names_the_crashed_rank_and_resumes_on_simulated_ranks(tmp_path):
    """lib_dist.three_d.resume.train, what a notebook calls (on real ranks:
    test_three_d_failure_cluster.py): on simulated ranks, threads of one process, the rank
    told to crash raises rather than ending the process; the run resumes at another layout."""
    data = [batches(step, BATCHES) for step in range(STEPS)]
    with pytest.raises(RankFailure) as failed:
        SimulatedWorld(4, timeout=20).run(train_resumable, Layout(2, 1, 2), CONFIG, data,
                                          tmp_path, every=EVERY, lr=LR, crash=(1, DIES_AT))
    assert failed.value.ranks == [1], failed.value
    assert crashed_at(tmp_path) is not None and latest(tmp_path) == tmp_path / "step4"
    resumed = SimulatedWorld(4, timeout=20).run(train_resumable, Layout(1, 2, 2), CONFIG, data,
                                                tmp_path, every=EVERY, lr=LR, resume=True)
    want = one_process(STEPS, BATCHES)
    for rank, progress in enumerate(resumed):
        assert progress.start == 4 and sorted(progress.losses) == [4, 5], progress
        assert progress.checkpoint_bytes > 0  # (dp=1): every rank writes its shards
        for step, loss in progress.losses.items():
            assert abs(loss - want[step]) <= 1e4 * EPS64, (rank, step, loss, want[step])
