"""Algorithms the comm tests run on every backend: the same function on the simulated world
(threads) and on real gloo processes, so their results and traces can be compared.

A plain module (no pytest import), importable from spawned children: every function takes a
`Communicator` first and uses only its public interface.
"""

from __future__ import annotations

import torch

from lib_dist.comm import Communicator, chunk_bounds, wait_all
from lib_dist.comm.algorithms import gather_broadcast


def data(rank: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank-specific, integer-valued data: exact under float sums, so backends agree bitwise."""
    return (torch.arange(n) % 7 + 10 * rank + 1).to(dtype)


# -- point to point -----------------------------------------------------------------------


def send_recv_pairs(comm: Communicator, n: int) -> torch.Tensor | None:
    """Even ranks send to the next rank with blocking send/recv; odd ranks return what they
    got. A last even rank without partner (odd world size) sits out and returns None."""
    r = comm.rank
    if r % 2 == 0:
        if r + 1 < comm.world_size:
            comm.send(data(r, n), r + 1)
            return data(r, n)
        return None
    buf = torch.empty(n)
    comm.recv(buf, r - 1)
    return buf


def ring_pass(comm: Communicator, n: int) -> list[torch.Tensor]:
    """N-1 steps round the ring with isend/irecv: each step passes on what arrived last.
    Every rank ends with every rank's data (indexed by rank) after sending N-1 messages of
    n float32 each."""
    r, N = comm.rank, comm.world_size
    right, left = (r + 1) % N, (r - 1) % N
    got: list[torch.Tensor | None] = [None] * N
    got[r] = data(r, n)
    current = got[r]
    for step in range(N - 1):
        incoming = torch.empty(n)
        wait_all([comm.isend(current, right), comm.irecv(incoming, left)])
        got[(r - step - 1) % N] = incoming
        current = incoming
    return got  # type: ignore[return-value]


def ring_all_reduce(comm: Communicator, n: int) -> torch.Tensor:
    """Ring all-reduce (sum) of `data(rank, n)`: reduce-scatter then all-gather, 2(N-1)
    steps, each rank sending one chunk of `chunk_bounds(n, N)` to its right per step."""
    r, N = comm.rank, comm.world_size
    right, left = (r + 1) % N, (r - 1) % N
    x = data(r, n)
    bounds = chunk_bounds(n, N)

    def chunk(i: int) -> torch.Tensor:
        lo, hi = bounds[i % N]
        return x[lo:hi]

    for step in range(N - 1):  # reduce-scatter: after it, rank r owns chunk (r + 1) % N
        send, recv = chunk(r - step), chunk(r - step - 1)
        buf = torch.empty_like(recv)
        wait_all([comm.isend(send.clone(), right), comm.irecv(buf, left)])
        recv += buf
    for step in range(N - 1):  # all-gather: pass the finished chunks round
        send, recv = chunk(r + 1 - step), chunk(r - step)
        buf = torch.empty_like(recv)
        wait_all([comm.isend(send.clone(), right), comm.irecv(buf, left)])
        recv.copy_(buf)
    return x


def registered_ring(comm: Communicator, n: int) -> torch.Tensor:
    """`data(rank, n)` summed by lab03's ring from the solution notebook, registered in this
    process (`lib_dist.registry`, as a student's would be) and chosen by name."""
    from pathlib import Path

    from lib_dist import registry

    if registry.all_reduce_algorithm(registry.MINE) is None:
        registry.use_my_answers(Path(__file__).resolve().parent.parent / "solutions",
                                "ring_all_reduce")
    return comm.all_reduce(data(comm.rank, n), "sum", algorithm=registry.MINE)


def gather_then_broadcast(comm: Communicator, n: int) -> torch.Tensor:
    """All-reduce (sum) through rank 0 (`lib_dist.comm.algorithms.gather_broadcast`): every
    rank sends its n float32 to rank 0, which adds them up and sends the total back to each."""
    x = data(comm.rank, n)
    gather_broadcast(comm, x)
    return x


def barrier_twice(comm: Communicator) -> int:
    comm.barrier()
    comm.barrier()
    return comm.rank


# -- collectives ----------------------------------------------------------------------------


def collectives(comm: Communicator, n: int, scatter_lengths: list[int]) -> dict[str, object]:
    """Every collective of the interface on rank-specific data; results keyed by name."""
    r = comm.rank
    out: dict[str, object] = {}
    for root in range(comm.world_size):
        out[f"broadcast_from_{root}"] = comm.broadcast(data(r, n), src=root)
    out["all_reduce_sum"] = comm.all_reduce(data(r, n), "sum")
    out["all_reduce_avg"] = comm.all_reduce(data(r, n), "avg")
    out["all_reduce_int"] = comm.all_reduce(data(r, n, torch.int64))
    out["all_gather"] = comm.all_gather(data(r, n))
    for m in scatter_lengths:
        out[f"reduce_scatter_sum_{m}"] = comm.reduce_scatter(data(r, m), "sum")
        out[f"reduce_scatter_avg_{m}"] = comm.reduce_scatter(data(r, m), "avg")
    out["reduce_scatter_2d"] = comm.reduce_scatter(data(r, 12).reshape(3, 4))
    return out


def expected_collectives(world_size: int, rank: int, n: int,
                         scatter_lengths: list[int]) -> dict[str, object]:
    """What `collectives` must return on `rank`, computed locally without communication."""
    every = [data(q, n) for q in range(world_size)]
    total = torch.stack(every).sum(0)

    def reduced_chunk(m: int) -> torch.Tensor:
        full = torch.stack([data(q, m) for q in range(world_size)]).sum(0)
        lo, hi = chunk_bounds(m, world_size)[rank]
        return full[lo:hi]

    out: dict[str, object] = {f"broadcast_from_{root}": data(root, n)
                              for root in range(world_size)}
    out["all_reduce_sum"] = total
    out["all_reduce_avg"] = total / world_size
    out["all_reduce_int"] = total.to(torch.int64)
    out["all_gather"] = every
    for m in scatter_lengths:
        out[f"reduce_scatter_sum_{m}"] = reduced_chunk(m)
        out[f"reduce_scatter_avg_{m}"] = reduced_chunk(m) / world_size
    out["reduce_scatter_2d"] = reduced_chunk(12)
    return out


# -- all_to_all ------------------------------------------------------------------------------

# gloo's all_to_all has no int16 ("Invalid scalar type"); these it has
A2A_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8, torch.bool)
HIDDEN = 3


def tokens(src: int, dst: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What rank `src` sends rank `dst`: (src + 2 dst) % 4 rows of HIDDEN values (some pieces
    empty, the others of 1 to 3 rows, as a router sends each expert its own number of
    tokens), every value naming both ranks."""
    rows = (src + 2 * dst) % 4
    values = torch.arange(rows * HIDDEN).reshape(rows, HIDDEN) + 100 * src + 10 * dst
    return values % 3 == 0 if dtype == torch.bool else values.to(dtype)


def exchange_tokens(comm: Communicator, dtype: torch.dtype = torch.float32
                    ) -> list[torch.Tensor]:
    """One uneven all_to_all of `tokens` into preallocated outputs; returns what arrived."""
    r, n = comm.rank, comm.world_size
    outputs = [torch.full_like(tokens(s, r, dtype), 7) for s in range(n)]
    got = comm.all_to_all([tokens(r, d, dtype) for d in range(n)], outputs)
    assert all(g is o for g, o in zip(got, outputs)), "all_to_all must fill `outputs`"
    return got


def all_to_all_cases(comm: Communicator) -> dict[str, object]:
    """all_to_all on uneven pieces in every dtype of A2A_DTYPES, on equal pieces with the
    default outputs, and on non-contiguous 2-d pieces; results keyed by case."""
    r, n = comm.rank, comm.world_size
    out: dict[str, object] = {f"uneven_{dtype}": exchange_tokens(comm, dtype)
                              for dtype in A2A_DTYPES}
    out["equal_default_outputs"] = comm.all_to_all([data(r, 5) + 1000 * d for d in range(n)])
    out["transposed_pieces"] = comm.all_to_all(
        [(data(r, 6) + 1000 * d).reshape(2, 3).t() for d in range(n)])
    return out


def expected_all_to_all(world_size: int, rank: int) -> dict[str, object]:
    """What `all_to_all_cases` must return on `rank`, without communication: the transpose
    of the ranks' input lists (rank d receives piece d of every rank's list)."""
    def transposed(piece) -> list[torch.Tensor]:
        every = [[piece(s, d) for d in range(world_size)] for s in range(world_size)]
        return [every[s][rank] for s in range(world_size)]

    out: dict[str, object] = {f"uneven_{dtype}": transposed(lambda s, d: tokens(s, d, dtype))
                              for dtype in A2A_DTYPES}
    out["equal_default_outputs"] = transposed(lambda s, d: data(s, 5) + 1000 * d)
    out["transposed_pieces"] = transposed(
        lambda s, d: (data(s, 6) + 1000 * d).reshape(2, 3).t().contiguous())
    return out


def _disagree(comm: Communicator, case: str) -> tuple[str, str] | None:
    """One all_to_all in which the ranks disagree as `case` says; the error it raised on this
    rank, (type name, message), or None if it raised nothing."""
    r, n = comm.rank, comm.world_size
    inputs = [tokens(r, d) for d in range(n)]
    outputs = [torch.empty_like(tokens(s, r)) for s in range(n)]
    if r == 1 and case in ("smaller", "larger", "reshaped"):
        rows = tokens(0, 1).shape[0]  # 2 rows of HIDDEN = 3
        outputs[0] = torch.empty({"smaller": (rows - 1, HIDDEN), "larger": (rows + 1, HIDDEN),
                                  "reshaped": (HIDDEN, rows)}[case])
    if case == "dtype" and r == n - 1:
        inputs = [t.double() for t in inputs]
        outputs = [t.double() for t in outputs]
    if case == "too_few_inputs" and r == 0:
        inputs = inputs[:-1]
    if case == "mixed_dtypes" and r == 0:
        inputs[-1] = inputs[-1].double()
    try:
        comm.all_to_all(inputs, outputs)
    except Exception as e:  # noqa: BLE001 - what each rank got is the result
        return type(e).__name__, str(e)
    return None


DISAGREEMENTS = ("smaller", "larger", "reshaped", "dtype", "too_few_inputs", "mixed_dtypes")


def all_to_all_disagreements(comm: Communicator) -> dict[str, object]:
    """Each of DISAGREEMENTS in turn (what every rank raised), then an exchange that agrees:
    a disagreement leaves the group usable."""
    out: dict[str, object] = {case: _disagree(comm, case) for case in DISAGREEMENTS}
    out["after"] = exchange_tokens(comm)
    return out


def all_to_all_in_subgroup(comm) -> dict[str, object]:
    """On a torch communicator: a subgroup's ranks must be in increasing order (an error on
    every rank); then all_to_all over the subgroup of every rank but rank 0 (subgroup rank =
    rank - 1), an uneven exchange and a disagreement."""
    out: dict[str, object] = {}
    try:
        comm.subgroup([1, 0])
    except ValueError as e:
        out["unsorted"] = str(e)
    sub = comm.subgroup(list(range(1, comm.world_size)))
    if sub is None:
        return out
    try:
        out.update(rank=sub.rank, uneven=exchange_tokens(sub), after=exchange_tokens(sub),
                   smaller=_disagree(sub, "smaller") if sub.world_size > 1 else None)
    finally:
        sub.close()
    return out


# -- failures ---------------------------------------------------------------------------------


def assorted_messages(comm: Communicator, n: int) -> list[torch.Tensor] | None:
    """Even rank r posts a run of messages to rank r + 1 at once: empty, 0-d, bool, int8,
    complex, bfloat16 and a float32 of `n` elements (larger than a shared-memory channel);
    rank r + 1 posts the receives at once and returns what arrived, which must be whole and
    in order."""
    g = torch.Generator().manual_seed(comm.rank // 2)
    tensors = [torch.zeros(0), torch.tensor(3.5), torch.rand(7, generator=g) > 0.5,
               torch.randint(-100, 100, (9,), generator=g, dtype=torch.int8),
               torch.randn(5, generator=g, dtype=torch.complex64),
               torch.randn(1000, generator=g).to(torch.bfloat16), torch.randn(n, generator=g)]
    peer = comm.rank ^ 1
    if peer >= comm.world_size:
        return None
    if comm.rank % 2 == 0:
        wait_all([comm.isend(t, peer) for t in tensors])
        return None
    into = [torch.empty_like(t) for t in tensors]
    wait_all([comm.irecv(b, peer) for b in into])
    return into


def delivered_while_blocked(comm: Communicator, n: int) -> torch.Tensor | None:
    """Rank 1 posts a receive of `n` floats, then sits in a barrier before waiting for it;
    rank 0's blocking send must complete anyway (the transport moves bytes in the background,
    as gloo's thread does), or the two never meet in the barrier."""
    if comm.rank == 0:
        comm.send(data(0, n), 1)
    elif comm.rank == 1:
        buffer = torch.empty(n)
        handle = comm.irecv(buffer, 0)
        comm.barrier()
        handle.wait()
        return buffer
    comm.barrier()
    return None


def both_send_first(comm: Communicator, n: int) -> None:
    """Ranks 0 and 1 each send to the other before receiving: with rendezvous sends, a
    deadlock. Other ranks do nothing."""
    if comm.rank > 1:
        return
    peer = 1 - comm.rank
    buf = torch.empty(n)
    comm.send(data(comm.rank, n), peer)
    comm.recv(buf, peer)


# -- entry point of a spawned rank (tests/test_torch_backend.py) ---------------------------


def torch_rank_main(rank: int, world_size: int, port: int, timeout: float,
                    checks: list[tuple[str, str, tuple]], queue, messages: str) -> None:
    """One real rank: join the gloo group through the parent's TCPStore, run each check
    `(name, function name in this module, args)` with a fresh trace, and put
    `(rank, name, status, pickled payload, trace events as dicts)` on `queue`, status "ok"
    (payload: the result) or "error" (payload: (exception type name, message)). Stops at the
    first error, since a failed gloo group is unusable. Ends with a "done" entry.

    `messages`: join_group's, or "arm64": "auto" on a machine that says it is an arm64 one,
    where shared memory must not be used (`lib_dist.comm.fast.shared_memory_supported`)."""
    import pickle
    import platform
    import traceback
    from datetime import timedelta

    import torch.distributed as dist

    from lib_dist.comm import Trace, join_group

    expected = messages
    if messages == "arm64":
        platform.machine = lambda: "arm64"
        messages, expected = "auto", "backend"
    try:
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=timedelta(seconds=120))
        # Rendezvous here first, so that slow torch imports don't eat join_group's timeout.
        store.set(f"arrived/{rank}", "1")
        store.wait([f"arrived/{q}" for q in range(world_size)], timedelta(seconds=120))
        comm = join_group(rank, world_size, store, timeout=timeout, messages=messages)
        assert comm.messages == expected, (comm.messages, expected)
        if expected == "backend" and messages == "auto":  # nothing of the fast paths
            assert comm._all_reduces.shared is None
            assert "shared_memory" not in {comm.choose_all_reduce(n) for n in (8, 1 << 24)}
            assert "shared_memory" not in comm.tuner.fits
        for name, fn_name, args in checks:
            comm.trace = Trace()
            try:
                result = globals()[fn_name](comm, *args)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                queue.put((rank, name, "error", pickle.dumps((type(e).__name__, str(e))),
                           comm.trace.to_dicts()))
                break
            queue.put((rank, name, "ok", pickle.dumps(result), comm.trace.to_dicts()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, "<setup>", "error",
                   pickle.dumps((type(e).__name__, traceback.format_exc())), []))
    finally:
        queue.put((rank, None, "done", b"", []))


def assert_same(got, want, where: str = "") -> None:
    """Exact equality of nested results: tensors by shape, dtype and value."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: got {type(got).__name__}"
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"{where}: got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}")
        assert torch.equal(got, want), f"{where}: got {got}, want {want}"
    elif isinstance(want, dict):
        assert set(got) == set(want), where
        for k in want:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where
