"""Which positions of the sequence each rank holds, for context parallelism.

Context parallelism splits one sequence of T tokens over N ranks: rank r keeps the queries,
keys and values of its positions only, so every activation of length T is divided by N. How
the positions are dealt out matters because attention is causal:

- contiguous: rank r holds one block of consecutive positions. Under the causal mask, rank 0's
  queries see only their own keys while rank N-1's see every key: the last rank does about
  2N - 1 times the first's work, and the ring waits for it;
- zig-zag (load-balanced): the sequence is cut into 2N chunks and rank r holds chunk r and
  chunk 2N - 1 - r, an early one and a late one, so every rank does the same work (to within
  a chunk's rounding).

T need not be a multiple of N (or 2N): chunk sizes then differ by at most one token. Every
rank can compute every rank's positions from (T, N), which is how a receiver knows the shape
of the keys and values a peer sends it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def even_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of `parts` consecutive pieces of range(n), sizes differing by at most 1
    (the larger ones first)."""
    small, extra = divmod(n, parts)
    bounds, start = [], 0
    for p in range(parts):
        end = start + small + (p < extra)
        bounds.append((start, end))
        start = end
    return bounds


@dataclass(frozen=True)
class Layout:
    """The split of a sequence of `seq_len` positions over `world_size` ranks."""

    seq_len: int
    world_size: int
    zigzag: bool = True

    def __post_init__(self) -> None:
        pieces = 2 * self.world_size if self.zigzag else self.world_size
        if self.seq_len < pieces:
            raise ValueError(f"a sequence of {self.seq_len} tokens cannot be split into "
                             f"{pieces} non-empty {'zig-zag ' if self.zigzag else ''}chunks "
                             f"for {self.world_size} ranks; use a longer sequence or fewer "
                             f"ranks")

    def positions(self, rank: int) -> torch.Tensor:
        """The global positions rank `rank` holds, in order: (its number of tokens,)."""
        if not self.zigzag:
            start, end = even_bounds(self.seq_len, self.world_size)[rank]
            return torch.arange(start, end)
        chunks = even_bounds(self.seq_len, 2 * self.world_size)
        early, late = chunks[rank], chunks[2 * self.world_size - 1 - rank]
        return torch.cat([torch.arange(*early), torch.arange(*late)])

    def sizes(self) -> list[int]:
        """How many tokens each rank holds."""
        return [len(self.positions(r)) for r in range(self.world_size)]

    def shard(self, x: torch.Tensor, rank: int, dim: int = -2) -> torch.Tensor:
        """Rank `rank`'s positions of the full-sequence tensor `x` (sequence along `dim`)."""
        return x.index_select(dim, self.positions(rank).to(x.device))

    def unshard(self, pieces: list[torch.Tensor], dim: int = -2) -> torch.Tensor:
        """The full sequence from every rank's piece (by rank): `shard`'s inverse."""
        order = torch.cat([self.positions(r) for r in range(self.world_size)])
        full = torch.cat(pieces, dim=dim)
        return full.index_select(dim, torch.argsort(order).to(full.device))

    def causal_pairs(self) -> list[int]:
        """Per rank, the (query, key) pairs the causal mask leaves it: its share of the work."""
        everyone = torch.arange(self.seq_len)
        return [int((self.positions(r)[:, None] >= everyone[None, :]).sum())
                for r in range(self.world_size)]


__all__ = ["Layout", "even_bounds"]
