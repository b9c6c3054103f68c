"""lib_dist.recompute against the same model without recomputation and against torch's own
`torch.utils.checkpoint`: the same gradients, dropout's masks replayed, less saved."""

from __future__ import annotations

import copy

import pytest
import torch

from lib_dist.models import GPT, GPTConfig
from lib_dist.recompute import TorchCheckpointed, checkpoint, checkpoint_blocks, selective_blocks
from lib_dist.train.memory import saved_activations

CONFIG = GPTConfig(vocab_size=32, block_size=16, n_layer=3, n_head=2, n_embd=16, dropout=0.2)


def gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(CONFIG).double()


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (4, CONFIG.block_size),
                         generator=torch.Generator().manual_seed(seed))


def gradients(model: GPT, x: torch.Tensor, seed: int = 7) -> dict[str, torch.Tensor]:
    """One backward pass of the mean logit energy, from generator state `seed` (dropout)."""
    model.zero_grad()
    torch.manual_seed(seed)
    model(x)[0].pow(2).mean().backward()
    # a wrapped block's parameters are named blocks.0.block.ln1.weight: named as unwrapped
    return {name.replace(".block.", "."): p.grad.clone() for name, p in model.named_parameters()}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    # the same operations on the same float64 numbers; only the order in which a residual
    # stream's two gradients are summed may differ: a few units in the last place
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-15, msg=name)


def test_recomputed_blocks_give_the_gradients_of_the_plain_model_dropout_included():
    plain, x = gpt(), tokens()
    recomputed = copy.deepcopy(plain)
    checkpoint_blocks(recomputed.blocks)
    assert_same(gradients(recomputed, x), gradients(plain, x))


def test_they_equal_torch_utils_checkpoint_on_each_block():
    ours, x = gpt(), tokens()
    theirs = copy.deepcopy(ours)
    checkpoint_blocks(ours.blocks)
    checkpoint_blocks(theirs.blocks, wrapper=TorchCheckpointed)
    assert_same(gradients(ours, x), gradients(theirs, x))


def test_without_replaying_the_random_state_dropout_draws_other_masks():
    """The common mistake: the recomputed forward is not the forward that was run."""
    plain, x = gpt(), tokens()
    forgetful = copy.deepcopy(plain)
    checkpoint_blocks(forgetful.blocks, replay_rng=False)
    want, got = gradients(plain, x), gradients(forgetful, x)
    assert not torch.allclose(got["blocks.0.mlp.fc.weight"], want["blocks.0.mlp.fc.weight"])


def test_the_generator_goes_on_as_if_nothing_was_recomputed():
    model, x = gpt(), tokens()
    checkpoint_blocks(model.blocks)
    torch.manual_seed(3)
    model(x)[0].sum().backward()  # the backward pass replays, then restores the generator
    after = torch.rand(3)
    torch.manual_seed(3)
    model(x)
    assert torch.equal(torch.rand(3), after)


def test_only_each_blocks_input_is_saved_for_it():
    plain, x = gpt(), tokens()
    recomputed, outside = copy.deepcopy(plain), copy.deepcopy(plain)
    checkpoint_blocks(recomputed.blocks)
    for i, block in enumerate(outside.blocks):  # what the model saves outside its blocks
        outside.blocks[i] = _Unsaved(block)
    sizes = {}
    for name, model in (("plain", plain), ("recomputed", recomputed), ("outside", outside)):
        with saved_activations(model) as saved:
            model(x)
        sizes[name] = sum(size for _, size in saved.values())
    block_input = x.numel() * CONFIG.n_embd * 8  # (B, T, C) in float64
    assert sizes["recomputed"] == sizes["outside"] + CONFIG.n_layer * block_input, sizes
    assert sizes["plain"] > sizes["recomputed"] + 10 * CONFIG.n_layer * block_input, sizes


class _Unsaved(torch.nn.Module):
    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.block(x)


def test_inputs_that_are_not_tensors_are_refused_with_what_to_do():
    with pytest.raises(TypeError, match="functools.partial"):
        checkpoint(lambda x, n: x * n, torch.ones(2), 3)


def test_selective_recomputation_gives_the_plain_models_gradients_dropout_included():
    plain, x = gpt(), tokens()
    selective = copy.deepcopy(plain)
    selective_blocks(selective.blocks)
    got = {name.replace(".attn.attn.", ".attn."): g for name, g in gradients(selective, x).items()}
    assert_same(got, gradients(plain, x))


def test_selective_recomputation_saves_no_score_sized_tensor_and_keeps_the_rest():
    """Scores, probabilities and the dropout mask are (B, heads, T, T) each; what selective
    recomputation keeps instead is q, k and v, one (B, T, 3C) tensor a block, and its
    core's own intermediate tensors are not saved."""
    plain, x = gpt(), tokens()
    selective = copy.deepcopy(plain)
    selective_blocks(selective.blocks)
    saved = {}
    for name, model in (("plain", plain), ("selective", selective)):
        with saved_activations(model) as found:
            model(x)
        saved[name] = found
    B, T = x.shape
    score = B * CONFIG.n_head * T * T * 8  # float64
    scores = [size for _, size in saved["plain"].values() if size == score]
    assert len(scores) >= 2 * CONFIG.n_layer  # softmax's output and the dropped-out weights
    assert not [size for _, size in saved["selective"].values() if size == score]
    total = {name: sum(size for _, size in found.values()) for name, found in saved.items()}
    # the score-sized tensors are gone, and nothing larger came in their place
    assert total["selective"] <= total["plain"] - len(scores) * score, total
