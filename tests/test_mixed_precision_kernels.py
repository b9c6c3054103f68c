"""`final_losses_with_kernels` runs `train_in_precision` in a child process on the CPU kernels
asked for: the child reports them, and on this process's own kernels it gives this process's
losses exactly (a run is deterministic on given kernels)."""

from __future__ import annotations

import math

import torch

from lib_dist.data import CharTokenizer, build_corpus
from lib_dist.mixed_precision.experiments import train_in_precision
from lib_dist.mixed_precision.kernels import final_losses_with_kernels
from lib_dist.models import GPTConfig

MODES = ("fp32", "bf16 autocast")


def tiny_config() -> tuple[torch.Tensor, GPTConfig]:
    corpus = build_corpus()
    tokenizer = CharTokenizer(corpus.text)
    return (tokenizer.encode(corpus.text),
            GPTConfig(tokenizer.vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8))


def test_the_child_uses_the_kernels_asked_for():
    _, config = tiny_config()
    capability, losses = final_losses_with_kernels("default", MODES, config, steps=10, seed=1)
    assert capability == "DEFAULT"
    assert sorted(losses) == sorted(MODES) and all(math.isfinite(v) for v in losses.values())


def test_on_this_process_kernels_the_child_repeats_this_process_run_exactly():
    tokens, config = tiny_config()
    here = torch.backends.cpu.get_cpu_capability()
    capability, losses = final_losses_with_kernels(here.lower(), MODES, config, steps=10, seed=1)
    assert capability == here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                      # as the child runs
    try:
        for mode in MODES:
            assert losses[mode] == train_in_precision(mode, tokens, config, steps=10,
                                                      seed=1).final()
    finally:
        torch.set_num_threads(threads)
