"""lib_dist.models: the MLP and the tiny GPT (shapes, parameter count, weight tying,
causality, generation, and that it can learn)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tolerances import tolerance, worst

from lib_dist.models import GPT, MLP, GPTConfig, bigram_logits
from lib_dist.train import gpt_num_params

CONFIG = GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16)


def test_mlp_shapes_and_layers():
    model = MLP(64, [32, 16], 10)
    assert model(torch.zeros(5, 8, 8)).shape == (5, 10)  # images are flattened
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(64, 32), (32, 16), (16, 10)]
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 2


def test_gpt_logits_shape_and_parameter_formula():
    model = GPT(CONFIG)
    idx = torch.randint(11, (3, 10))
    assert model(idx).shape == (3, 10, 11)
    assert model.num_params() == gpt_num_params(CONFIG)
    assert model.head.weight is model.tok_emb.weight
    bigger = GPTConfig(vocab_size=96, block_size=64, n_layer=3, n_head=4, n_embd=48)
    assert GPT(bigger).num_params() == gpt_num_params(bigger)


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = GPT(CONFIG).eval()
    idx = torch.randint(11, (1, 12))
    changed = idx.clone()
    changed[0, 7] = (idx[0, 7] + 1) % 11
    a, b = model(idx), model(changed)
    # rounding alone, for logits of this size through sums of n_embd terms: the past ignores
    # the future; the positions from 7 on see the change, far beyond rounding
    tol = tolerance(a.dtype, a.abs().max(), CONFIG.n_embd)
    assert worst(a[:, :7], b[:, :7]) <= tol
    assert worst(a[:, 7:], b[:, 7:]) > 100 * tol


def test_gpt_rejects_long_sequences_and_bad_heads():
    with pytest.raises(ValueError, match="block_size"):
        GPT(CONFIG)(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(vocab_size=5, n_embd=10, n_head=4)


def test_generate_extends_within_vocabulary_reproducibly():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 20, generator=torch.Generator().manual_seed(5))
    again = model.generate(prompt, 20, generator=torch.Generator().manual_seed(5))
    assert out.shape == (1, 23) and torch.equal(out[:, :3], prompt) and torch.equal(out, again)
    assert out.min() >= 0 and out.max() < 11
    greedy = model.generate(prompt, 5, top_k=1)
    assert torch.equal(greedy, model.generate(prompt, 5, top_k=1))


def test_gpt_learns_a_periodic_sequence():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    seq = torch.arange(16) % 5  # 0 1 2 3 4 0 1 ...: each token determines the next
    x, y = seq[None, :-1].repeat(4, 1), seq[None, 1:].repeat(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        loss = F.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1))
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 2.0 and loss.item() < 0.05


def test_bigram_logits_are_smoothed_pair_frequencies():
    tokens = torch.tensor([0, 1, 0, 1, 2, 0, 1])  # 0 is followed by 1 three times
    table = bigram_logits(tokens, vocab_size=3)
    assert table.shape == (3, 3)
    assert torch.allclose(table.exp().sum(1), torch.ones(3, dtype=torch.float64))
    assert table[0].exp().tolist() == pytest.approx([1 / 6, 4 / 6, 1 / 6])  # (0+1, 3+1, 0+1) / 6
    assert table[2].exp().tolist() == pytest.approx([2 / 4, 1 / 4, 1 / 4])
    assert torch.isfinite(bigram_logits(tokens, 4)).all()  # unseen token 3: uniform, not -inf
