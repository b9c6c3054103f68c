"""lib_dist.experts in one process: the router's top-k and its gates (not renormalised), the
capacity formula, assignments dropped in token order, `MoE` against a dense computation (every
expert run on every token, masked), and the Switch load-balancing loss on hand-made
routings."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lib_dist.experts import (MoE, Router, Routing, balance_loss, capacity, keep_in_order,
                              kept_counts, load_balancing_loss)
from lib_dist.models.gpt import FeedForward

from tolerances import rounding

C, E = 4, 4
F64 = torch.float64


def moe(k: int, capacity_factor: float | None = None, expert=None) -> MoE:
    torch.manual_seed(0)
    return MoE(C, E, k, capacity_factor, expert).double()


def tokens(n: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, C, dtype=F64, generator=torch.Generator().manual_seed(seed))


def kept_by_hand(chosen: list[list[int]], limit: int | None) -> list[list[bool]]:
    """Walk the tokens in order, counting each expert's places: the drop rule, written out."""
    taken = [0] * E
    out = []
    for experts in chosen:
        row = []
        for e in experts:
            row.append(limit is None or taken[e] < limit)
            taken[e] += 1
        out.append(row)
    return out


def dense(layer: MoE, x: torch.Tensor, kept: list[list[bool]]) -> torch.Tensor:
    """Every expert on every token, each output weighted by the token's gate for that expert
    where the assignment was kept, else 0: the layer's sum without any gathering."""
    routing = layer.router(x)
    weight = torch.zeros(x.shape[0], E, dtype=F64)
    for t in range(x.shape[0]):
        for j in range(layer.k):
            if kept[t][j]:
                weight[t, routing.chosen[t, j]] = routing.gates[t, j]
    return sum(weight[:, e:e + 1] * expert(x) for e, expert in enumerate(layer.experts))


def test_router_keeps_the_k_most_probable_experts_with_their_probabilities_as_gates():
    torch.manual_seed(0)
    router = Router(C, E, k=2).double()
    x = tokens()
    got = router(x)
    probs = torch.softmax(x @ router.gate.weight.T, dim=-1)
    torch.testing.assert_close(got.probs, probs, rtol=0, atol=rounding(probs, C))
    order = probs.argsort(dim=-1, descending=True)[:, :2]
    assert torch.equal(got.chosen, order)
    # not renormalised: the gates are the probabilities themselves, summing to less than 1
    torch.testing.assert_close(got.gates, probs.gather(1, order), rtol=0, atol=0)
    assert (got.gates.sum(1) < 1 - 1e-3).all()
    assert router.gate.bias is None


def test_k_must_be_between_one_and_the_number_of_experts():
    with pytest.raises(ValueError, match=r"k of the 4 experts, 1 <= k <= 4; got k=5"):
        Router(C, E, k=5)
    with pytest.raises(ValueError, match="capacity_factor must be positive"):
        MoE(C, E, capacity_factor=0.0)


def test_capacity_is_the_ceiling_of_factor_tokens_k_over_experts():
    assert capacity(10, 2, 4, 1.0) == 5
    assert capacity(10, 1, 4, 1.25) == 4     # ceil(3.125)
    assert capacity(16, 1, 4, 1.0) == 4
    assert capacity(10, 2, 4, None) is None


def test_assignments_past_capacity_are_dropped_in_token_order():
    chosen = torch.tensor([[0], [0], [1], [0], [0], [1]])
    assert keep_in_order(chosen, 2, 2).flatten().tolist() == [1, 1, 1, 0, 0, 1]
    # one place of expert 0 already taken by earlier tokens (another rank's)
    assert keep_in_order(chosen, 2, 2, taken=torch.tensor([1, 0])).flatten().tolist() == [
        1, 0, 1, 0, 0, 1]
    two = torch.tensor([[0, 1], [1, 2], [2, 0], [0, 1]])
    assert keep_in_order(two, 3, 1).tolist() == [[1, 1], [0, 1], [0, 0], [0, 0]]
    assert keep_in_order(two, 3, None).all()
    # the same rule over ranks' counts: rank 1's assignments come after rank 0's
    counts = torch.tensor([[3, 0], [2, 2]])
    assert kept_counts(counts, 4).tolist() == [[3, 0], [1, 2]]
    assert kept_counts(counts, None).tolist() == counts.tolist()


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("factor", [None, 0.5])
def test_moe_equals_every_expert_on_every_token_masked(k, factor):
    layer = moe(k, factor)
    x = tokens(12)
    out, aux = layer(x.reshape(2, 6, C))
    chosen = layer.router(x).chosen.tolist()
    kept = kept_by_hand(chosen, layer.capacity(12))
    want = dense(layer, x, kept)
    # the router's C terms, the expert's C and 4C, k outputs summed
    torch.testing.assert_close(out.reshape(12, C), want, rtol=0, atol=rounding(want, 6 * C + k))
    if factor is not None:
        dropped = [t for t, row in enumerate(kept) if not any(row)]
        assert dropped and (out.reshape(12, C)[dropped] == 0).all()
    torch.testing.assert_close(aux, load_balancing_loss(layer.router(x)), rtol=0, atol=0)


def test_experts_are_module_2s_feed_forward_unless_a_factory_is_given():
    assert all(type(e) is FeedForward for e in moe(1).experts)
    layer = moe(2, expert=lambda: nn.Linear(C, C))
    assert all(type(e) is nn.Linear for e in layer.experts)
    x = tokens()
    out, _ = layer(x)
    want = dense(layer, x, kept_by_hand(layer.router(x).chosen.tolist(), None))
    torch.testing.assert_close(out, want, rtol=0, atol=rounding(want, 2 * C + 2))


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_load_balancing_loss_on_a_hand_made_routing():
    router = Router(2, 2, k=1).double()
    with torch.no_grad():
        router.gate.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 1.0]]))
    # logits (2, 0) three times: expert 0 with p0 = s(2); then (0, 1): expert 1, p0 = s(-1)
    x = torch.tensor([[1.0, 0.0]] * 3 + [[0.0, 1.0]], dtype=F64)
    routing = router(x)
    assert routing.chosen.flatten().tolist() == [0, 0, 0, 1]
    p0 = (3 * sigmoid(2) + sigmoid(-1)) / 4
    want = 2 * (0.75 * p0 + 0.25 * (1 - p0))
    assert load_balancing_loss(routing).item() == pytest.approx(want, rel=1e-15)


def test_load_balancing_loss_is_the_formula_and_one_when_uniform():
    fraction, mean_prob = torch.tensor([0.5, 0.25, 0.25, 0.0]), torch.tensor(
        [0.4, 0.3, 0.2, 0.1], dtype=F64)
    assert balance_loss(fraction, mean_prob).item() == pytest.approx(
        4 * (0.5 * 0.4 + 0.25 * 0.3 + 0.25 * 0.2), rel=1e-15)
    # k = 2 of 4: f counts assignments, of tokens * k
    probs = torch.full((3, 4), 0.25, dtype=F64)
    routing = Routing(probs, torch.tensor([[0, 1], [0, 2], [0, 3]]), probs[:, :2])
    assert load_balancing_loss(routing).item() == pytest.approx(1.0, rel=1e-15)
    # a uniform router (zero gate): P_e = 1 / E whatever the ties chose
    layer = moe(2)
    with torch.no_grad():
        layer.router.gate.weight.zero_()
    _, aux = layer(tokens())
    assert aux.item() == pytest.approx(1.0, rel=1e-15)
    # favouring one expert costs more
    with torch.no_grad():
        layer.router.gate.weight[0] = 5.0
    x = tokens().abs()
    assert layer(x)[1].item() > 1.5
