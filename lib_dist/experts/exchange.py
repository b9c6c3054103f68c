"""The two all-to-alls of expert parallelism, as autograd functions.

Dispatch sends each token's row to the rank holding its expert; combine sends the experts'
outputs back to the tokens' ranks. Both are one `Communicator.all_to_all` of rows: this rank's
tensor is cut into consecutive blocks of `send[d]` rows, block d goes to rank d, and the
blocks received, `recv[s]` rows from rank s, are concatenated in rank order. Sizes differ per
peer (routing is uneven), which is why every rank must know `recv` before the exchange (the
layer learns it from the counts gathered before dispatch, `lib_dist.experts.parallel`).

Each one's backward is the same exchange reversed (send and recv swapped): the gradient of a
row goes back to the rank it came from, as tensor parallelism's f and g are each other's
transpose (`lib_dist.tensor_parallel.functions`). So combine's backward carries the outputs'
gradients to the experts, and dispatch's backward carries the inputs' gradients home: two
all-to-alls forward, two backward. Every rank must run both backwards (they are collective):
every rank's loss must depend on the layer's output.
"""

from __future__ import annotations

from functools import partial

import torch

from ..comm import Communicator
from ..comm.autograd import Transposed


def exchange_rows(x: torch.Tensor, comm: Communicator, send: list[int],
                  recv: list[int], agreed: bool = False) -> torch.Tensor:
    """Rows `x` cut into blocks of `send[d]` rows for rank d; returns the `recv[s]` rows from
    each rank s, concatenated in rank order. One `all_to_all`; no autograd. `agreed`: every
    rank read its sizes from one table, so the all-to-all need not check them."""
    if sum(send) != x.shape[0]:
        raise ValueError(f"rank {comm.rank}: sends {sum(send)} rows ({send} to ranks "
                         f"0..{len(send) - 1}) but holds {x.shape[0]}")
    inputs = [block.contiguous() for block in x.split(send)]
    outputs = [x.new_empty((n, *x.shape[1:])) for n in recv]
    return torch.cat(comm.all_to_all(inputs, outputs, agreed=agreed))


def dispatch(x: torch.Tensor, comm: Communicator, send: list[int], recv: list[int],
             agreed: bool = False) -> torch.Tensor:
    """`send[d]` rows of x to rank d; the `recv[s]` rows from each rank s, in rank order."""
    return _exchanged(x, comm, send, recv, agreed)


def combine(y: torch.Tensor, comm: Communicator, send: list[int], recv: list[int],
            agreed: bool = False) -> torch.Tensor:
    """As `dispatch`, for the experts' outputs on their way back (send: what dispatch received,
    recv: what it sent)."""
    return _exchanged(y, comm, send, recv, agreed)


def _exchanged(x: torch.Tensor, comm: Communicator, send: list[int], recv: list[int],
               agreed: bool) -> torch.Tensor:
    """`exchange_rows` forward; the same exchange reversed (send and recv swapped) backward."""
    return Transposed.apply(
        x, partial(exchange_rows, comm=comm, send=send, recv=recv, agreed=agreed),
        partial(exchange_rows, comm=comm, send=recv, recv=send, agreed=agreed))
