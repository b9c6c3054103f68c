"""lib_dist's pipeline on 4 real ranks (engines, gloo): GPipe and 1F1B leave the gradients and
loss of torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B on the same stages, and of
one process; a schedule whose stages all receive first fails within its timeout, naming every
rank and the receive it waits in, and the cluster goes on."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from lib_dist.cluster import Cluster, RankTimeout
from lib_dist.models.gpt import GPTConfig
from lib_dist.pipeline import (Stage, gpipe_step, gpt_layers, next_token_loss, one_f_one_b_step,
                               recv_forward, split_model)


from tolerances import gpt_terms, rounding

pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster]

CONFIG = GPTConfig(vocab_size=23, block_size=8, n_layer=4, n_head=2, n_embd=16)
M = 4
TERMS = gpt_terms(CONFIG, 8 * CONFIG.block_size) + M  # batch()'s 8 sequences, M micro-batches


@pytest.fixture(scope="module")
def cluster():
    with Cluster(4, timeout=30) as c:
        yield c


def batch():
    g = torch.Generator().manual_seed(3)
    return (torch.randint(CONFIG.vocab_size, (8, CONFIG.block_size), generator=g),
            torch.randint(CONFIG.vocab_size, (8, CONFIG.block_size), generator=g))


def both_frameworks(comm, parts, x, y, schedule):
    """This rank's loss and gradients after lib_dist's step, then after torch's."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    module = parts[comm.rank]
    first, last = comm.rank == 0, comm.rank == comm.world_size - 1
    ours = gpipe_step if schedule == "GPipe" else one_f_one_b_step
    stage = Stage(module, comm, boundary_shape=(CONFIG.block_size, CONFIG.n_embd),
                  loss_fn=next_token_loss if last else None)
    loss = ours(comm, stage, x, y, M)
    mine = [p.grad.clone() for p in module.parameters()]
    module.zero_grad(set_to_none=True)
    cls = ScheduleGPipe if schedule == "GPipe" else Schedule1F1B
    theirs = cls(PipelineStage(module, comm.rank, comm.world_size, torch.device("cpu")), M,
                 loss_fn=next_token_loss)
    losses: list[torch.Tensor] = []
    theirs.step(*((x,) if first else ()), target=y if last else None,
                losses=losses if last else None, return_outputs=False)
    torch_loss = torch.stack(losses).mean().item() if last else None
    return loss, torch_loss, mine, [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_our_steps_equal_torchs_pipelining_and_one_process(cluster, schedule):
    layers = gpt_layers(CONFIG, seed=2)
    x, y = batch()
    oracle = copy.deepcopy(nn.Sequential(*layers))
    want = next_token_loss(oracle(x), y)
    want.backward()
    results = cluster.run(both_frameworks, split_model(layers, 4), x, y, schedule)
    loss, torch_loss, _, _ = results[-1]
    assert loss == pytest.approx(torch_loss, abs=rounding(want, TERMS))
    assert loss == pytest.approx(want.item(), abs=rounding(want, TERMS))
    ours = [g for _, _, mine, _ in results for g in mine]
    theirs = [g for _, _, _, torchs in results for g in torchs]
    for a, b, c in zip(ours, theirs, [p.grad for p in oracle.parameters()], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=rounding(c, TERMS))
        torch.testing.assert_close(a, c, rtol=0, atol=rounding(c, TERMS))


def receive_first(comm):
    """Every stage waits for its input before anyone has sent one; the first stage, for a
    gradient."""
    stage = Stage(nn.Identity(), comm, boundary_shape=(2,),
                  loss_fn=(lambda out, y: out.sum()) if comm.rank == 3 else None)
    if stage.is_first:
        comm.recv(stage.receive_buffer(1), 1)
    else:
        recv_forward(comm, stage, 1)


def test_a_deadlocked_schedule_fails_within_its_timeout_naming_every_rank(cluster):
    with pytest.raises(RankTimeout) as info:
        cluster.run(receive_first, timeout=4)
    assert "did not finish within 4 s" in str(info.value)
    assert info.value.ranks == [0, 1, 2, 3]
    for rank, peer in [(0, 1), (1, 0), (2, 1), (3, 2)]:
        assert f"rank {rank}: waiting in recv from rank {peer}" in str(info.value)
    assert cluster.run(lambda comm: comm.rank) == [0, 1, 2, 3]
