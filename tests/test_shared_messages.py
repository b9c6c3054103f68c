"""The shared-memory message transport on its own, with ranks as threads: order, lanes,
messages of many pieces, a mismatched receive buffer, a timeout that names the operation,
and closing. tests/test_torch_backend.py runs it between real processes."""

from __future__ import annotations

import pytest
import torch

from lib_dist.comm import CommError, CommTimeout, MismatchError
from lib_dist.comm.fast.channels import SLOT, SLOTS, Channels
from lib_dist.comm.fast.files import map_shared_files
from lib_dist.comm.fast.messages import SharedMemoryMessages

from rank_threads import Threads

pytestmark = pytest.mark.timeout(120)


def opened(world_size: int, timeout: float = 30.0):
    """fn(rank, transport) on `world_size` thread ranks, each with its own transport."""
    def run(fn):
        def rank_fn(rank, gather):
            files = map_shared_files(rank, world_size, gather,
                                     Channels.file_bytes(world_size), "messages")
            assert files is not None
            transport = SharedMemoryMessages(rank, world_size, files, timeout)
            try:
                return fn(rank, transport)
            finally:
                transport.close()
        return Threads(world_size).run(rank_fn)
    return run


def test_messages_arrive_whole_and_in_order_across_many_pieces():
    big = SLOT * SLOTS // 4 * 3 + 5  # floats: three channels' worth, and a ragged last piece
    sizes = [big, 0, 1, 10, big // 2]

    def fn(rank, transport):
        if rank == 0:
            sends = [transport.isend(torch.arange(n, dtype=torch.float32) + i, 1)
                     for i, n in enumerate(sizes)]
            for s in sends:
                s.wait()
            return None
        into = [torch.empty(n) for n in sizes]
        for r in [transport.irecv(b, 0) for b in into]:
            r.wait()
        return into

    got = opened(2)(fn)[1]
    for i, (n, t) in enumerate(zip(sizes, got)):
        assert torch.equal(t, torch.arange(n, dtype=torch.float32) + i), n


def test_lanes_do_not_take_each_others_messages():
    def fn(rank, transport):
        if rank == 0:
            a = transport.isend(torch.full((3,), 1.0), 1, lane=1)
            b = transport.isend(torch.full((3,), 2.0), 1, lane=0)
            a.wait(), b.wait()
            return None
        user, inner = torch.empty(3), torch.empty(3)
        r0 = transport.irecv(user, 0, lane=0)  # posted first, but lane 1's message is not his
        r1 = transport.irecv(inner, 0, lane=1)
        r0.wait(), r1.wait()
        return user, inner

    user, inner = opened(2)(fn)[1]
    assert torch.equal(user, torch.full((3,), 2.0)) and torch.equal(inner, torch.full((3,), 1.0))


def test_a_buffer_of_the_wrong_size_or_dtype_is_named():
    def fn(rank, transport):
        if rank == 0:
            try:
                transport.isend(torch.ones(4), 1).wait()
            except CommError as e:
                return e
            return None
        try:
            transport.irecv(torch.empty(5, dtype=torch.float64), 0).wait()
        except MismatchError as e:
            return str(e)

    sender, receiver = opened(2, timeout=1.0)(fn)
    assert receiver.startswith("rank 1: recv from rank 0: the message holds 4 elements of "
                               "torch.float32 (16 bytes) but the buffer has 5 of torch.float64")
    assert isinstance(sender, CommTimeout)  # the receiver never took it


def test_an_unmatched_receive_times_out_and_names_its_peer():
    def fn(rank, transport):
        if rank == 1:
            return None
        try:
            transport.irecv(torch.empty(2), 1).wait()
        except CommTimeout as e:
            after = transport.isend(torch.ones(1), 1)
            with pytest.raises(CommError, match="must be rebuilt"):
                after.wait()
            return str(e)

    message = opened(2, timeout=0.5)(fn)[0]
    assert message == ("rank 0: recv from rank 1 did not complete within 0.5 s; the group "
                       "is now unusable and must be rebuilt")


def test_close_fails_what_is_pending():
    def fn(rank, transport):
        if rank == 1:
            return None
        pending = transport.irecv(torch.empty(1), 1)
        transport.close()
        with pytest.raises(CommError, match="closed"):
            pending.wait()
        return "ok"

    assert opened(2)(fn)[0] == "ok"
