"""Module 02's tiny GPT and its text, as the benchmarks train it: the corpus tokenized by
characters, split into training and validation tokens, and the model's configuration
(context `context`, 2 layers, 4 heads, width 64: 0.1 M parameters)."""

from __future__ import annotations

import torch

from lib_dist.data import CharTokenizer, build_corpus, split_tokens
from lib_dist.models import GPTConfig


def tiny_gpt(context: int = 64) -> tuple[GPTConfig, torch.Tensor, torch.Tensor]:
    """(config, training tokens, validation tokens)."""
    corpus = build_corpus()
    tokenizer = CharTokenizer(corpus.text)
    train_ids, val_ids = split_tokens(tokenizer.encode(corpus.text), val_fraction=0.1)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=context, n_layer=2, n_head=4,
                       n_embd=64)
    return config, train_ids, val_ids
