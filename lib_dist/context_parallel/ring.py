"""Ring attention: exact causal attention over a sequence split across ranks (`Layout`), the
keys and values travelling around the ring while each rank keeps its own queries.

Rank r holds q, k, v for its positions only, each (B, heads, its tokens, head size). In N
steps it meets every rank's keys and values: at step s it computes with the block that
started on rank r - s while already receiving the next one from rank r - 1 and passing the
current one to rank r + 1 (the receive and send are posted before the block's compute, so the
transfer hides behind it). Each K/V block is sent N - 1 times, once per hop.

Attention over a row of keys is a softmax, which needs the row's maximum and sum over *all*
keys; the blocks arrive one at a time. The running form keeps, per query, the maximum m seen
so far, the sum l of exp(score - m) and the weighted values acc; a new block with maximum m'
rescales what was kept by exp(m - max(m, m')) before adding its own terms. At the end
out = acc / l, exactly softmax(scores) @ v, and m + log l is the row's log-sum-exp (module 1's
identity), saved for backward. Forgetting the rescaling (adding exp(score - m') terms to sums
taken against another maximum) is the classic mistake.

Backward goes around the ring once more: each rank recomputes its queries' probabilities
against each block from the saved log-sum-exp, adds to dq, and adds to that block's dk and dv,
which travel with the block; after N hops they are back with the block's owner.

The causal mask compares global positions, so any layout works. A rank's positions are one or
two runs of consecutive positions (contiguous or zig-zag), and so are a block's; each pair of
runs is either hidden by the mask (skipped: no compute), fully visible (no mask needed), or on
the diagonal (masked). Skipping is what makes causal attention cost half of full attention,
and what the zig-zag layout spreads evenly.

On a simulated world with a virtual clock (`lib_dist.comm.clock`), `pair_cost` prices each
block's compute by the scores it computes (`block_scores`), so the timeline shows the next
block's transfer beside the current block's work; `overlap=False` waits for the next block
before computing, the schedule without overlap (`lib_dist.context_parallel.timeline`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from ..comm import Communicator
from ..comm.point_to_point import wait_all
from .layout import Layout


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Communicator,
                   layout: Layout, *, pair_cost: float = 0.0, overlap: bool = True
                   ) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence's keys and values,
    each tensor (B, heads, this rank's tokens, head size) as `layout` deals the positions.
    `pair_cost`: virtual time per (query, key) score of a block's compute (forward); `overlap`
    False: receive the next block before computing this one, instead of during."""
    if layout.world_size != comm.world_size:
        raise ValueError(f"the layout splits the sequence over {layout.world_size} ranks; the "
                         f"communicator has {comm.world_size}")
    expected = layout.sizes()[comm.rank]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4 or t.shape[2] != expected:
            raise ValueError(f"rank {comm.rank}: {name} has shape {tuple(t.shape)}; expected "
                             f"(B, heads, {expected}, head size): this rank's {expected} "
                             f"positions of the layout")
    return RingAttention.apply(q, k, v, comm, layout, pair_cost, overlap)


class RingAttention(torch.autograd.Function):
    """forward: attention with K/V blocks around the ring; backward: around again, dk and dv
    travelling with their blocks."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                comm: Communicator, layout: Layout, pair_cost: float = 0.0,
                overlap: bool = True) -> torch.Tensor:
        n, rank, d = comm.world_size, comm.rank, q.shape[-1]
        positions = [layout.positions(r).to(q.device) for r in range(n)]
        sizes = [len(p) for p in positions]
        scale = 1.0 / math.sqrt(d)
        m = q.new_full((*q.shape[:-1], 1), -math.inf)  # the running maximum of each row
        total = q.new_zeros((*q.shape[:-1], 1))         # sum of exp(score - m)
        acc = torch.zeros_like(q)                       # sum of exp(score - m) * value
        block = torch.cat([k, v], dim=-1).contiguous()  # (B, heads, tokens, 2 x head size)
        for step in range(n):
            src = (rank - step) % n
            handles, incoming = [], None
            if step < n - 1:  # the next block travels while this one is computed
                incoming = block.new_empty(*block.shape[:2], sizes[(src - 1) % n], 2 * d)
                handles = [comm.irecv(incoming, (rank - 1) % n), comm.isend(block, (rank + 1) % n)]
            if not overlap:
                wait_all(handles)
            cost = pair_cost * block_scores(positions[rank], positions[src])
            with comm.compute(f"A{src}", cost):  # attention with the block of rank src
                k_s, v_s = block.split(d, dim=-1)
                for qs, ks, allowed in visible_pairs(positions[rank], positions[src]):
                    m[qs], total[qs], acc[qs] = _fold(q[qs], k_s[ks], v_s[ks], allowed, scale,
                                                      m[qs], total[qs], acc[qs])
            wait_all(handles)
            if incoming is not None:
                block = incoming
        out = acc / total
        ctx.save_for_backward(q, k, v, out, m + total.log())
        ctx.comm, ctx.positions, ctx.scale = comm, positions, scale
        return out

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        comm: Communicator = ctx.comm
        n, rank, d, positions = comm.world_size, comm.rank, q.shape[-1], ctx.positions
        sizes = [len(p) for p in positions]
        delta = (d_out * out).sum(-1, keepdim=True)  # (B, heads, Tq, 1): rowsum(dO * O)
        dq = torch.zeros_like(q)
        # the block, and its dk and dv so far: (B, heads, tokens, 4 x head size)
        block = torch.cat([k, v, torch.zeros_like(k), torch.zeros_like(v)], dim=-1)
        for step in range(n):
            src = (rank - step) % n
            k_s, v_s, dk_s, dv_s = block.split(d, dim=-1)  # views: dk_s, dv_s in place
            for qs, ks, allowed in visible_pairs(positions[rank], positions[src]):
                scores = q[qs] @ k_s[ks].transpose(-2, -1) * ctx.scale
                if allowed is not None:
                    scores = scores.masked_fill(~allowed, -math.inf)
                p = torch.exp(scores - lse[qs])  # the forward's probabilities, recomputed
                dv_s[ks] += p.transpose(-2, -1) @ d_out[qs]
                ds = p * (d_out[qs] @ v_s[ks].transpose(-2, -1) - delta[qs])
                dq[qs] += ds @ k_s[ks] * ctx.scale
                dk_s[ks] += ds.transpose(-2, -1) @ q[qs] * ctx.scale
            if n == 1:
                break
            last = step == n - 1  # only dk and dv still travel: home to their owner
            sent = block[..., 2 * d:].contiguous() if last else block
            incoming = block.new_empty(*block.shape[:2], sizes[(src - 1) % n],
                                       sent.shape[-1])
            wait_all([comm.irecv(incoming, (rank - 1) % n), comm.isend(sent, (rank + 1) % n)])
            block = incoming if not last else torch.cat([k, v, incoming], dim=-1)
        _, _, dk, dv = block.split(d, dim=-1)
        nothing = (None,) * (len(ctx.needs_input_grad) - 3)  # comm, layout, and the pricing
        return (dq, dk.contiguous(), dv.contiguous(), *nothing)


Rows = tuple[Any, ...]  # an index of a (B, heads, tokens, width) tensor's token rows


def visible_pairs(q_pos: torch.Tensor, k_pos: torch.Tensor
                  ) -> Iterator[tuple[Rows, Rows, torch.Tensor | None]]:
    """For each run of consecutive query positions and each run of key positions that the
    causal mask does not hide entirely: their rows, and the mask (None where every query sees
    every key)."""
    for qa, qb in _runs(q_pos):
        for ka, kb in _runs(k_pos):
            qp, kp = q_pos[qa:qb], k_pos[ka:kb]
            if qp[-1] < kp[0]:
                continue  # every query precedes every key
            allowed = None if qp[0] >= kp[-1] else qp[:, None] >= kp[None, :]
            yield (..., slice(qa, qb), slice(None)), (..., slice(ka, kb), slice(None)), allowed


def block_scores(q_pos: torch.Tensor, k_pos: torch.Tensor) -> int:
    """How many (query, key) scores a rank holding `q_pos` computes against a block holding
    `k_pos`: the rectangles of `visible_pairs` (a diagonal one whole, masked after)."""
    return sum((qs[1].stop - qs[1].start) * (ks[1].stop - ks[1].start)
               for qs, ks, _ in visible_pairs(q_pos, k_pos))


def _runs(positions: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive positions."""
    breaks = (torch.nonzero(positions[1:] != positions[:-1] + 1).flatten() + 1).tolist()
    edges = [0, *breaks, len(positions)]
    return list(zip(edges[:-1], edges[1:]))


def _fold(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
          scale: float, m: torch.Tensor, total: torch.Tensor, acc: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The running (maximum, sum, weighted values) with one more block of keys folded in."""
    scores = q @ k.transpose(-2, -1) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
    safe = new_m.masked_fill(torch.isinf(new_m), 0.0)  # a row that has seen no key yet
    p = torch.exp(scores - safe)
    rescale = torch.exp(m - safe)  # what was summed against the old maximum
    return new_m, total * rescale + p.sum(-1, keepdim=True), acc * rescale + p @ v


__all__ = ["RingAttention", "block_scores", "ring_attention"]
