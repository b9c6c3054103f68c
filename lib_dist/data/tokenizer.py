"""A character-level tokenizer: one token per character, the simplest vocabulary there is."""

from __future__ import annotations

import torch


class CharTokenizer:
    """Maps each distinct character of a text to an id, in sorted order of the characters.

    `CharTokenizer(text).encode("abc")` is a 1-D int64 tensor; `decode` inverts it. Encoding a
    character the vocabulary lacks raises a KeyError naming it.
    """

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.ids = {ch: i for i, ch in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        try:
            return torch.tensor([self.ids[ch] for ch in text], dtype=torch.int64)
        except KeyError as e:
            raise KeyError(f"character {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join(self.chars[i] for i in ids)
