"""Expert parallelism: the experts of one `MoE` spread over the ranks, tokens sent to them.

With N ranks and E experts (E a multiple of N), rank r holds experts r*E/N .. (r+1)*E/N - 1
and a replica of the router. Each rank brings its own tokens (its share of the batch, as in
data parallelism). A forward:

1. route this rank's tokens (the replicated router, locally);
2. **count**: one `all_gather` of every rank's per-expert counts (and router probability
   sums). Every rank needs the whole (ranks x experts) matrix, not only what it receives, so
   this is a gather rather than an all-to-all of counts: capacity and the drop order are
   global, as if one process had routed every rank's tokens concatenated in rank order
   (rank 0's tokens first). How many of rank r's assignments to expert e fit depends on how
   many places ranks 0..r-1 took, and what each rank receives from each peer follows from the
   matrix too, so the exchanges below have exact sizes (no padding to capacity);
3. **dispatch**: one `all_to_all` of the kept rows, each to the rank of its expert (sorted by
   expert, then token order);
4. run the local experts on what arrived (an expert's rows from every rank, in rank order);
5. **combine**: one `all_to_all` of the outputs back, then each token sums its gate-weighted
   outputs (`lib_dist.experts.moe.combine_rows`), exactly as `MoE` does.

The load-balancing loss is the whole batch's: f_e from the gathered counts, P_e from the
gathered probability sums. Its value is the same on every rank, but its gradient flows only
through this rank's probabilities: summed over the ranks (`sync_router_grads`), the router's
gradients are those of one process's loss sum_r loss_r + aux (each rank adds aux once; the
shares add up to its gradient once). The experts' gradients need no reduction: the backward
all-to-alls bring each expert every rank's contribution. Under autograd, every forward is two
all-to-alls and every backward two, whether or not x needs a gradient on this rank.
"""

from __future__ import annotations

import torch
from torch import nn

from ..comm import Communicator
from ..comm.agreement import dtype_code, dtype_of
from ..comm.errors import MismatchError
from .exchange import combine, dispatch
from .moe import MoE, combine_rows
from .routing import assignments, balance_loss, capacity, kept_counts, keep_in_order


class ExpertParallelMoE(nn.Module):
    """`ExpertParallelMoE(moe, comm)(x)`: this rank's (output, aux loss) of `moe` run on every
    rank's tokens at once. Holds, without copying, `moe`'s router and this rank's experts, and
    nothing else of `moe` (drop it, and the other experts are freed); on a simulated world,
    give each rank its own copy of `moe`."""

    def __init__(self, moe: MoE, comm: Communicator):
        super().__init__()
        n, experts = comm.world_size, moe.n_experts
        if experts % n:
            raise ValueError(f"expert parallelism splits the {experts} experts evenly over the "
                             f"{n} ranks: {experts} is not a multiple of {n}")
        self.comm = comm
        self.n_experts, self.k, self.capacity_factor = experts, moe.k, moe.capacity_factor
        self.local = experts // n
        self.first = comm.rank * self.local                 # this rank's first expert
        self.router = moe.router
        self.experts = nn.ModuleList(moe.experts[self.first:self.first + self.local])

    def expert_ids(self) -> range:
        """The global indices of the experts this rank holds (its `experts[i]` is expert
        `first + i` of the `MoE`)."""
        return range(self.first, self.first + self.local)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        comm, n, E, L = self.comm, self.comm.world_size, self.n_experts, self.local
        flat = x.reshape(-1, x.shape[-1])
        routing = self.router(flat)
        local_sums = routing.probs.sum(0)                   # (experts,), this rank's share
        counts, prob_sums = self._gather(routing.counts(), local_sums, flat)
        tokens = int(counts.sum()) // self.k                 # every rank's tokens
        limit = capacity(tokens, self.k, E, self.capacity_factor)
        fits = kept_counts(counts, limit)                    # (ranks, experts)
        kept = keep_in_order(routing.chosen, E, limit, taken=counts[:comm.rank].sum(0))
        token, slot, _ = assignments(routing.chosen, kept)
        send = fits[comm.rank].view(n, L).sum(1).tolist()    # rows to each rank's experts
        recv = fits[:, self.first:self.first + L].sum(1).tolist()  # rows from each rank
        rows = flat[token]
        if torch.is_grad_enabled() and not rows.requires_grad:
            # dispatch's backward is collective: run it on every rank, even where x needs no
            # gradient (then it carries one nobody reads), so that no rank waits for it alone
            rows = rows.detach().requires_grad_()
        # send and recv are read from `fits`, one table on every rank: agreed, no check
        arrived = dispatch(rows, comm, send, recv, agreed=True)
        done = combine(self._run_experts(arrived, fits), comm, recv, send, agreed=True)
        out = combine_rows(done, token, routing.gates[token, slot], flat)

        # the whole batch's value, the gradient of this rank's share only
        mean_prob = (local_sums + (prob_sums.to(flat.dtype) - local_sums).detach()) / tokens
        aux = balance_loss(counts.sum(0).double() / (tokens * self.k), mean_prob)
        return out.reshape(x.shape), aux

    def _gather(self, counts: torch.Tensor, prob_sums: torch.Tensor, rows: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's counts, (ranks, experts) int64, and the probability sums over every
        token, (experts,) float64: one all_gather of [counts, sums, the rows' dtype and
        width] in float64 (exact below 2**53). The sizes of both all-to-alls come from this
        one table, so they agree; the dtype and width are checked here, on every rank."""
        E = self.n_experts
        shape = torch.tensor([dtype_code(rows.dtype), rows.shape[-1]], dtype=torch.float64)
        mine = torch.cat([counts.double(), prob_sums.detach().double(), shape])
        every = torch.stack(self.comm.all_gather(mine.to(self.comm.device))).cpu()
        check_rows_agree(self.comm.rank, every[:, 2 * E].long().tolist(),
                         every[:, 2 * E + 1].long().tolist())
        return every[:, :E].long(), every[:, E:2 * E].sum(0)

    def _run_experts(self, arrived: torch.Tensor, fits: torch.Tensor) -> torch.Tensor:
        """The local experts' outputs, in the order the rows arrived: by source rank, then
        by expert, then token order. Each expert runs once, on its rows from every rank."""
        n, L = self.comm.world_size, self.local
        mine = fits[:, self.first:self.first + L]            # (ranks, local experts)
        blocks = list(arrived.split(mine.reshape(-1).tolist()))  # block s * L + i
        for i, expert in enumerate(self.experts):
            rows = [blocks[s * L + i] for s in range(n)]
            outs = expert(torch.cat(rows)).split([len(r) for r in rows])
            for s in range(n):
                blocks[s * L + i] = outs[s]
        return torch.cat(blocks)

    @torch.no_grad()
    def sync_router_grads(self) -> None:
        """Sum the router's gradients over the ranks (each holds its tokens' share); call after
        backward, on every rank. Averaging data parallelism does the same up to 1/N."""
        for p in self.router.parameters():
            if p.grad is not None:
                self.comm.all_reduce(p.grad, "sum")


def check_rows_agree(rank: int, dtypes: list[int], widths: list[int]) -> None:
    """Raise on every rank (each holds the same lists) if the ranks' rows differ in dtype or
    width: the all-to-alls would move bytes the receivers read as something else."""
    for what, values, shown in (("dtype", dtypes, lambda c: str(dtype_of(c)).split(".")[-1]),
                                ("width", widths, str)):
        if len(set(values)) > 1:
            every = ", ".join(f"rank {r} {shown(v)}" for r, v in enumerate(values))
            raise MismatchError(f"rank {rank}: all_to_all: ranks disagree on the {what} of the "
                                f"rows they exchange: {every}")
