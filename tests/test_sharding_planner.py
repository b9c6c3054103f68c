"""lib_dist.sharding.planner: its activation bytes and FLOPs against what autograd saves and what
torch's FLOP counter counts on the tiny GPT, for each recomputation; a plan's bytes against the
step's real peak (the CPU allocator); its plans against module 7's ZeRO formulas; the fastest
plan that fits, or none."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from lib_dist.comm import AlphaBeta
from lib_dist.mixed_precision import zero_bytes_per_rank
from lib_dist.models import GPT, GPTConfig
from lib_dist.recompute import checkpoint_blocks, selective_blocks
from lib_dist.sharding.planner import (RECOMPUTE, activation_bytes, best, plans, price,
                                       step_flops)
from lib_dist.train import gpt_num_params, measure_peak_memory
from lib_dist.train.memory import saved_activations

CONFIG = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16)
B = 4


def model(recompute: str, config: GPTConfig = CONFIG) -> GPT:
    torch.manual_seed(0)
    gpt = GPT(config)
    if recompute == "full":
        checkpoint_blocks(gpt.blocks)
    elif recompute == "selective":
        selective_blocks(gpt.blocks)
    return gpt


def loss(gpt: GPT, x: torch.Tensor) -> torch.Tensor:
    logits = gpt(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), x[:, 1:].reshape(-1))


def tokens() -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (B, CONFIG.block_size + 1),
                         generator=torch.Generator().manual_seed(0))


def saved(recompute: str) -> int:
    gpt = model(recompute)
    with saved_activations(gpt) as found:
        loss(gpt, tokens())
    return sum(nbytes for _, nbytes in found.values())


def test_what_recomputation_saves_is_what_the_formula_drops():
    plain = saved("none")
    assert activation_bytes(CONFIG, B) == pytest.approx(plain, rel=0.02)  # module 2's check
    for recompute in ("selective", "full"):
        # the same terms as the plain model's, less the ones recomputation drops: exact
        assert plain - saved(recompute) == (activation_bytes(CONFIG, B)
                                            - activation_bytes(CONFIG, B, recompute))


@pytest.mark.parametrize("recompute", RECOMPUTE)
def test_step_flops_are_what_torch_counts(recompute):
    gpt = model(recompute)
    with FlopCounterMode(display=False) as counter:
        loss(gpt, tokens()).backward()
    assert counter.get_total_flops() == step_flops(CONFIG, B, recompute)


# the test's GPT, and one whose attention tensors outweigh its width (h T / C = 16), where the
# backward's peak is in the last block's attention rather than at the loss
LONG = GPTConfig(vocab_size=40, block_size=64, n_layer=2, n_head=8, n_embd=32)


@pytest.mark.parametrize("config", [CONFIG, LONG], ids=["small", "long"])
@pytest.mark.parametrize("recompute", RECOMPUTE)
def test_a_plan_bounds_the_real_peak_by_at_most_its_gradients(config, recompute):
    # one rank, AdamW: the plan counts the gradients whole, the backward peaks before they all
    # exist, so the measured peak lies between the plan less its gradients and the plan
    gpt = model(recompute, config)
    ids = torch.randint(0, config.vocab_size, (B, config.block_size + 1),
                        generator=torch.Generator().manual_seed(0))

    def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1))

    peak = measure_peak_memory(gpt, torch.optim.AdamW(gpt.parameters()), ids[:, :-1],
                               ids[:, 1:], lm_loss).peak
    plan = price(config, B, 1, 0, recompute, 1e12, mixed=False)
    gradients = 4 * gpt_num_params(config)
    assert plan.bytes - gradients <= peak <= plan.bytes, (plan, peak)


def test_plans_hold_module_7s_bytes_per_parameter_and_communicate_only_with_peers():
    P = gpt_num_params(CONFIG)
    for plan in plans(CONFIG, B, 4, device_bytes=1e12, mixed=False):
        copy = 4 * P / 4 if plan.stage == 1 else 0  # the shard ZeRO-1 steps (ZeRO-2: in place)
        assert plan.state_bytes == zero_bytes_per_rank(plan.stage, 4, mixed=False).total * P + copy
        assert plan.fits and plan.communication_s > 0
    assert all(p.communication_s == 0 for p in plans(CONFIG, B, 1, device_bytes=1e12))
    stage3 = price(CONFIG, B, 4, 3, "none", 1e12, AlphaBeta(alpha=0.0, beta=1.0), mixed=False)
    stage1 = price(CONFIG, B, 4, 1, "none", 1e12, AlphaBeta(alpha=0.0, beta=1.0), mixed=False)
    assert stage3.communication_s == pytest.approx(1.5 * stage1.communication_s)


def test_the_best_plan_is_the_fastest_that_fits_or_none():
    options = dict(mixed=False, flops=1e9)
    everything = plans(CONFIG, B, 4, device_bytes=1e12, **options)
    assert best(CONFIG, B, 4, 1e12, **options) == everything[0]
    smallest = min(everything, key=lambda p: p.bytes)
    assert smallest.stage == 3 and smallest.recompute == "full"
    tight = best(CONFIG, B, 4, smallest.bytes, **options)
    assert tight is not None and tight.bytes <= smallest.bytes
    assert best(CONFIG, B, 4, smallest.bytes - 1, **options) is None
    with pytest.raises(ValueError, match="stages"):
        price(CONFIG, B, 4, 4, "none", 1e12)
    with pytest.raises(ValueError, match="recompute"):
        price(CONFIG, B, 4, 0, "some", 1e12)
