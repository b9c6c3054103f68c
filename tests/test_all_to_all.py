"""all_to_all, the exchange behind a mixture of experts' token dispatch, on simulated ranks:
its results against a one-process oracle (the transpose of the ranks' input lists), its
traffic against the formula, and ranks that disagree on what they exchange, which is an error
on every rank before any data moves, never a wrong result or a hang. The same cases on real
gloo ranks, and in a subgroup: tests/test_torch_backend.py."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import algorithms as alg
from algorithms import assert_same

from lib_dist.comm import CommError, MismatchError, PeerFailed, RankTraffic, SimulatedWorld
from lib_dist.comm.agreement import MAX_DIMS
from lib_dist.errors import RankFailure

pytestmark = pytest.mark.timeout(60)

SIZES = [1, 2, 3, 4, 8]


@pytest.mark.parametrize("world_size", SIZES)
def test_all_to_all_is_the_transpose_of_the_input_lists(world_size):
    results = SimulatedWorld(world_size).run(alg.all_to_all_cases)
    for r, got in enumerate(results):
        assert_same(got, alg.expected_all_to_all(world_size, r), f"rank {r}")


def test_inputs_are_left_alone():
    def fn(comm):
        inputs = [alg.tokens(comm.rank, d, torch.float64) for d in range(comm.world_size)]
        comm.all_to_all(inputs, [torch.empty_like(alg.tokens(s, comm.rank, torch.float64))
                                 for s in range(comm.world_size)])
        return inputs

    for r, inputs in enumerate(SimulatedWorld(3).run(fn)):
        assert_same(inputs, [alg.tokens(r, d, torch.float64) for d in range(3)])


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_traffic_is_every_piece_but_your_own_once(world_size):
    """Each rank sends each peer its piece, one message each, and keeps its own: with pieces
    of n/N bytes, (N-1)/N of its n bytes leave it, and as many arrive."""
    world = SimulatedWorld(world_size)
    world.run(alg.exchange_tokens)
    summary = world.trace.summary()
    for r in range(world_size):
        others = [q for q in range(world_size) if q != r]
        assert summary[r].sent_messages == summary[r].recv_messages == world_size - 1
        assert summary[r].sent_bytes == sum(alg.tokens(r, d).nbytes for d in others)
        assert summary[r].recv_bytes == sum(alg.tokens(s, r).nbytes for s in others)
        kinds = Counter(e.kind for e in world.trace.of_rank(r))
        assert kinds == Counter({"all_to_all_check": 1, "all_to_all": 1, "send": world_size - 1,
                                 "recv": world_size - 1})
        data = next(e for e in world.trace.of_rank(r) if e.kind == "all_to_all")
        assert data.nbytes == sum(alg.tokens(r, d).nbytes for d in range(world_size))

    n = 4 * 12 * world_size  # bytes per rank: 12 float32 per piece
    equal = SimulatedWorld(world_size)
    equal.run(lambda comm: comm.all_to_all(list(torch.ones(12 * world_size).chunk(world_size))))
    assert all(t.sent_bytes == t.recv_bytes == (world_size - 1) * n // world_size
               for t in equal.trace.summary().values())


def test_one_rank_keeps_its_piece_and_sends_nothing():
    world = SimulatedWorld(1)
    (got,) = world.run(lambda comm: comm.all_to_all([torch.arange(3.0)]))
    assert_same(got, [torch.arange(3.0)])
    assert world.trace.summary() == {0: RankTraffic()}


def test_more_dimensions_than_a_description_holds():
    shape = (1,) * (MAX_DIMS + 1) + (2,)

    def fn(comm, expected_shape):
        inputs = [torch.full(shape, 10.0 * comm.rank + d) for d in range(comm.world_size)]
        return comm.all_to_all(inputs, [torch.empty(expected_shape) for _ in inputs])

    for r, got in enumerate(SimulatedWorld(2).run(fn, shape)):
        assert_same(got, [torch.full(shape, 10.0 * s + r) for s in range(2)])
    err = _failing(SimulatedWorld(2, timeout=5.0), fn, (1,) * (MAX_DIMS + 1) + (3,))
    assert ("rank 0 sends rank 0 shape (1, 1, 1, 1, 1, 1, 1, then 3 dims of product 2), but "
            "rank 0 expects shape (1, 1, 1, 1, 1, 1, 1, then 3 dims of product 3) from rank 0"
            ) in str(err.exceptions[0])


# -- ranks that disagree, and bad input: an error on every rank -------------------------------


def _failing(world: SimulatedWorld, fn, *args) -> RankFailure:
    with pytest.raises(RankFailure) as info:
        world.run(fn, *args)
    assert info.value.ranks == list(range(world.world_size))  # every rank, not only the pair
    return info.value


SHAPES = {"smaller": "(1, 3)", "larger": "(3, 3)", "reshaped": "(3, 2)"}


@pytest.mark.parametrize("world_size", [2, 4])
def test_disagreements_are_an_error_on_every_rank(world_size):
    results = SimulatedWorld(world_size).run(alg.all_to_all_disagreements)
    for r, got in enumerate(results):
        for case, expects in SHAPES.items():
            kind, message = got[case]
            assert kind == "MismatchError" and message.startswith(f"rank {r}: all_to_all: ")
            assert message.endswith("no data moved): rank 0 sends rank 1 shape (2, 3), but "
                                    f"rank 1 expects shape {expects} from rank 0"), message
        kind, message = got["dtype"]
        last = world_size - 1
        assert kind == "MismatchError" and f"rank {last} float64" in message
        assert f"rank {last - 1} float32" in message
        kind, message = got["too_few_inputs"]
        assert kind == "CommError"
        assert message == (f"rank 0: all_to_all needs one input (and one output) per rank, "
                           f"{world_size}; got {world_size - 1} and {world_size}" if r == 0 else
                           f"rank {r}: all_to_all: rank 0 passed invalid arguments (see its "
                           f"error); no data moved")
        kind, message = got["mixed_dtypes"]
        assert kind == "CommError"
        assert ("moves one dtype, got torch.float32, torch.float64" if r == 0
                else "rank 0 passed invalid arguments") in message
        assert_same(got["after"], [alg.tokens(s, r) for s in range(world_size)])
    # every rank tells the same story
    for case in alg.DISAGREEMENTS:
        if case not in ("too_few_inputs", "mixed_dtypes"):
            assert len({got[case][1].split(": ", 1)[1] for got in results}) == 1, case


def test_many_disagreements_are_counted_past_the_first_few():
    def fn(comm):
        n = comm.world_size
        return comm.all_to_all([torch.ones(2) for _ in range(n)],
                               [torch.ones(3) for _ in range(n)])

    err = _failing(SimulatedWorld(4, timeout=5.0), fn)
    for r, e in err.exceptions.items():
        assert isinstance(e, MismatchError)
        text = str(e)
        assert text.startswith(f"rank {r}: all_to_all: ranks disagree on the shapes")
        assert "rank 0 sends rank 0 shape (2,), but rank 0 expects shape (3,) from rank 0" in text
        assert text.endswith("; and 12 more")  # 16 pairs, 4 spelled out


@pytest.mark.parametrize("inputs, needle", [
    (lambda n: torch.ones(n), "one input (and one output) per rank, 3; got Tensor"),
    (lambda n: [1.0] * n, "needs torch.Tensors, got float"),
], ids=["not-a-list", "not-tensors"])
def test_bad_input_on_one_rank_fails_every_rank(inputs, needle):
    def fn(comm):
        n = comm.world_size
        comm.all_to_all(inputs(n) if comm.rank == 2 else [torch.ones(1) for _ in range(n)])

    err = _failing(SimulatedWorld(3, timeout=5.0), fn)
    assert str(err.exceptions[2]).startswith("rank 2: all_to_all needs ")
    assert needle in str(err.exceptions[2])
    for r in (0, 1):
        assert isinstance(err.exceptions[r], CommError)
        assert "rank 2 passed invalid arguments" in str(err.exceptions[r])


def test_non_contiguous_output_fails_every_rank():
    def fn(comm):
        n = comm.world_size
        outputs = [torch.empty(3, 2).t() if comm.rank == 0 else torch.empty(2, 3)
                   for _ in range(n)]
        comm.all_to_all([torch.ones(2, 3) for _ in range(n)], outputs)

    err = _failing(SimulatedWorld(2, timeout=5.0), fn)
    assert "needs contiguous outputs" in str(err.exceptions[0])
    assert "rank 0 passed invalid arguments" in str(err.exceptions[1])


def test_a_rank_that_never_calls_it_is_named():
    def fn(comm):
        if comm.rank != 1:
            comm.all_to_all([torch.ones(2) for _ in range(comm.world_size)])

    with pytest.raises(RankFailure) as info:
        SimulatedWorld(3, timeout=5.0).run(fn)
    for r in (0, 2):
        e = info.value.exceptions[r]
        assert isinstance(e, PeerFailed) and "rank 1 returned without taking part" in str(e)


def test_agreed_sizes_skip_the_check():
    """`agreed=True` (sizes every rank read from one table): the same exchange, and no
    all_to_all_check in the trace."""
    def run(comm):
        pieces = [torch.full((comm.rank + 1,), float(d)) for d in range(comm.world_size)]
        expects = [torch.empty(s + 1) for s in range(comm.world_size)]
        return comm.all_to_all(pieces, expects, agreed=True)

    world = SimulatedWorld(3)
    for r, got in enumerate(world.run(run)):
        assert [t.tolist() for t in got] == [[float(r)] * (s + 1) for s in range(3)]
        assert "all_to_all_check" not in {e.kind for e in world.trace.of_rank(r)}
