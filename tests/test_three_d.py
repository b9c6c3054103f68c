"""3D parallelism (lib_dist.three_d) on a simulated world of 8 ranks: module 02's GPT trained
with data, pipeline and tensor parallelism at once has one process's loss curve, for every layout
of 8 ranks the issue names: in float64 to round-off, and in float32 over a run of 20 steps to
a bound derived from float32's epsilon (a gradient summed over dp=2 instead of averaged is 4
times past it); each kind of collective stays in its
own group (tensor-parallel all-reduces in tp, stage messages in pp, gradient all-reduces in
dp); layouts the model cannot take are refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lib_dist.comm import SimulatedWorld
from lib_dist.models.gpt import GPTConfig
from lib_dist.pipeline import gpt_layers, next_token_loss
from lib_dist.three_d import Layout, ThreeD, three_d_step

CONFIG = GPTConfig(vocab_size=11, block_size=6, n_layer=2, n_head=4, n_embd=8)
STEPS, LR, BATCH = 4, 0.1, 8
EPS64 = torch.finfo(torch.float64).eps


def batches(step: int, cycle: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s global batch: `cycle` batches in turn, so that the loss falls."""
    generator = torch.Generator().manual_seed(100 + step % cycle)
    tokens = torch.randint(CONFIG.vocab_size, (BATCH, CONFIG.block_size + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def one_process(steps: int = STEPS, cycle: int = 2,
                dtype: torch.dtype = torch.float64) -> list[float]:
    """The losses of `steps` SGD steps of the whole GPT in one process, in `dtype`."""
    model = nn.Sequential(*gpt_layers(CONFIG, seed=0)).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        x, y = batches(step, cycle)
        loss = next_token_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def three_d_training(comm, layout: Layout, m: int):
    three_d = ThreeD(comm, layout, CONFIG, seed=0, dtype=torch.float64)
    optimizer = torch.optim.SGD(three_d.parameters(), lr=LR, momentum=0.9)
    losses = [three_d_step(three_d, optimizer, *batches(step), m) for step in range(STEPS)]
    kinds = {name: sorted({e.kind for e in three_d.mesh[name].trace.events})
             for name in ("dp", "pp", "tp")}
    dp = three_d.mesh["dp"]
    dp_all_reduces = [e.nbytes for e in dp.trace.of_rank(dp.rank) if e.kind == "all_reduce"]
    grad_bytes = sum(p.numel() * p.element_size() for p in three_d.parameters())
    return losses, kinds, (dp_all_reduces, grad_bytes)


LAYOUTS = [(2, 2, 2), (4, 1, 2), (2, 4, 1), (1, 2, 4), (8, 1, 1)]  # the five


@pytest.mark.parametrize("shape", LAYOUTS)
def test_a_3d_parallel_gpt_has_one_process_loss_curve(shape):
    layout = Layout(*shape)
    m = min(2, BATCH // layout.dp)
    want = one_process()
    results = SimulatedWorld(8, timeout=60).run(three_d_training, layout, m)
    for rank, (losses, kinds, (dp_all_reduces, grad_bytes)) in enumerate(results):
        # float64: each loss a sum over at most a few thousand products of O(1) numbers
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want), rtol=0,
                                   atol=1e4 * EPS64, msg=f"{layout}, rank {rank}")
        if layout.tp > 1:
            assert "all_reduce" in kinds["tp"], kinds  # the blocks' f and g
        if layout.pp > 1:
            assert {"send", "recv"} & set(kinds["pp"]) or "isend" in kinds["pp"], kinds
        # in dp, a step's gradients flattened into one all-reduce (float64: one dtype), then
        # the loss's (one float64)
        assert dp_all_reduces == [grad_bytes, 8] * STEPS, (dp_all_reduces, grad_bytes)
    assert want[2] < want[0] and want[3] < want[1]  # it trains


def test_layouts_the_model_cannot_take_are_refused():
    def build(comm, layout):
        ThreeD(comm, layout, CONFIG)

    with pytest.raises(Exception, match=r"tp=8 does not divide the 4 heads"):
        SimulatedWorld(8).run(build, Layout(1, 1, 8))
    with pytest.raises(Exception, match=r"pp=8 stages for 4 layers"):
        SimulatedWorld(8).run(build, Layout(1, 8, 1))


RUN32 = 20  # steps of the float32 run


def float32_training(comm, layout: Layout, m: int) -> list[float]:
    three_d = ThreeD(comm, layout, CONFIG, seed=0, dtype=torch.float32)
    optimizer = torch.optim.SGD(three_d.parameters(), lr=LR, momentum=0.9)
    return [three_d_step(three_d, optimizer, *batches(step, 4), m) for step in range(RUN32)]


@pytest.mark.parametrize("shape", LAYOUTS)  # 5 to 8 s each on the shared 2-core machine
def test_a_float32_run_stays_on_one_process_curve(shape):
    """float32 over a run: each step's sums are reordered (tp partial sums, micro-batches,
    replicas), each loss off by at most ~1e3 terms x eps32 of its size; SGD with momentum
    0.9 and lr 0.1 carries a parameter's difference forward at most lr / (1 - 0.9) = 1 times
    a step, so over the run the differences add up at most linearly: RUN32 x 1e3 x eps32 x
    the loss bounds them (5.7e-3 here; this machine measured 3.6e-7 at (2,2,2))."""
    layout = Layout(*shape)
    want = one_process(RUN32, cycle=4, dtype=torch.float32)
    results = SimulatedWorld(8, timeout=60).run(float32_training, layout,
                                                min(2, BATCH // layout.dp))
    atol = RUN32 * 1e3 * torch.finfo(torch.float32).eps * max(want)
    for rank, losses in enumerate(results):
        worst = max(abs(a - b) for a, b in zip(losses, want))
        assert worst <= atol, (layout, rank, worst, atol)
    assert min(want[-4:]) < min(want[:4])  # it trains over the run
