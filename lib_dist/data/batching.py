"""Mini-batches, forever, reproducibly: the same seed gives the same batches, and a stream can be
saved and resumed mid-way (its whole state is a seed and a counter, see `state_dict`).

- `ExampleBatches`: shuffled batches of examples (x, y), epoch after epoch, each example once per
  epoch;
- `TokenBatches`: random windows of a token stream for language modelling: inputs
  `tokens[i : i + T]` and targets `tokens[i + 1 : i + T + 1]`, the same text shifted by one.
"""

from __future__ import annotations

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


def _generator(seed: int, counter: int) -> torch.Generator:
    """A generator for draw number `counter` of stream `seed`, independent of earlier draws."""
    return torch.Generator().manual_seed(seed * 1_000_003 + counter)


class ExampleBatches:
    """Shuffled mini-batches of `batch_size` rows of (x, y), epoch after epoch.

    Each epoch is a fresh permutation; the last incomplete batch of an epoch is dropped so every
    batch has the same size.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int = 0):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        if not 0 < batch_size <= len(x):
            raise ValueError(f"batch_size must be in 1..{len(x)}, got {batch_size}")
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    @property
    def batches_per_epoch(self) -> int:
        return len(self._order) // self.batch_size

    def __iter__(self) -> ExampleBatches:
        return self

    def __next__(self) -> Batch:
        if self.position == self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._permutation()
        start = self.position * self.batch_size
        idx = self._order[start:start + self.batch_size]
        self.position += 1
        return self.x[idx], self.y[idx]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        """The epoch's order of the examples (`self.epoch`'s): the batches take it in turn."""
        return torch.randperm(len(self.x), generator=_generator(self.seed, self.epoch))


class TokenBatches:
    """Batches of `batch_size` random windows of `block_size` tokens: (inputs, targets), both
    `(batch_size, block_size)` int64, targets being the inputs shifted one token ahead."""

    def __init__(self, tokens: torch.Tensor, block_size: int, batch_size: int, seed: int = 0):
        if tokens.dim() != 1 or len(tokens) <= block_size:
            raise ValueError(f"need a 1-D stream longer than block_size={block_size}, got shape "
                             f"{tuple(tokens.shape)}")
        self.tokens, self.block_size, self.batch_size = tokens, block_size, batch_size
        self.seed, self.count = seed, 0

    def __iter__(self) -> TokenBatches:
        return self

    def __next__(self) -> Batch:
        gen = _generator(self.seed, self.count)
        self.count += 1
        starts = torch.randint(len(self.tokens) - self.block_size, (self.batch_size,),
                               generator=gen)
        offsets = torch.arange(self.block_size)
        window = starts[:, None] + offsets
        return self.tokens[window], self.tokens[window + 1]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.seed, self.count = state["seed"], state["count"]


def split_tokens(tokens: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor,
                                                                            torch.Tensor]:
    """The first (1 - val_fraction) of the stream for training, the rest for validation.

    A contiguous split, not a shuffled one: windows of the two parts never overlap, so the
    validation loss measures text the model has not seen.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = int(len(tokens) * (1 - val_fraction))
    return tokens[:cut], tokens[cut:]
