"""The bigram model: the baseline every language model must beat, built by counting.

It predicts the next token from the previous one only, with the frequencies of each pair in the
training text. Add-one (Laplace) smoothing gives every pair a count of at least `smoothing`, so
that no probability is zero and no held-out text has infinite loss.
"""

from __future__ import annotations

import torch


def bigram_logits(tokens: torch.Tensor, vocab_size: int, smoothing: float = 1.0) -> torch.Tensor:
    """A (vocab_size, vocab_size) float64 table: row a holds log p(next = b | previous = a).

    Use it as logits: `bigram_logits(train)[inputs]` scores every position of `inputs` with any
    cross-entropy function; each row is already normalised.
    """
    counts = torch.full((vocab_size, vocab_size), float(smoothing), dtype=torch.float64)
    counts.index_put_((tokens[:-1], tokens[1:]), torch.ones(len(tokens) - 1, dtype=torch.float64),
                      accumulate=True)
    return (counts / counts.sum(dim=1, keepdim=True)).log()
