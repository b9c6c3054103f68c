"""scikit-learn's handwritten digits: 1797 images of 8x8 pixels, classes 0-9, bundled with
scikit-learn (nothing is downloaded): the course's first classifier learns them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Digits:
    """Train and test tensors: `x_*` float32 (N, 64) in [0, 1], `y_*` int64 (N,) in 0..9."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    @property
    def n_classes(self) -> int:
        return int(self.y_train.max()) + 1


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Digits:
    """The digits, split per class (stratified) so both sides keep the class balance.

    The same `seed` always gives the same split. Pixels (0..16) are scaled to [0, 1].
    """
    from sklearn.datasets import load_digits as sklearn_digits

    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    bunch = sklearn_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    train_idx, test_idx = [], []
    for c in y.unique(sorted=True):
        members = (y == c).nonzero().squeeze(1)
        members = members[torch.randperm(len(members), generator=gen)]
        n_test = round(len(members) * test_fraction)
        test_idx.append(members[:n_test])
        train_idx.append(members[n_test:])
    train, test = torch.cat(train_idx).sort().values, torch.cat(test_idx).sort().values
    return Digits(x[train], y[train], x[test], y[test])
