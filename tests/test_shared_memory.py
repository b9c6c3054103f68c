"""The shared-memory all-reduce: exact sums with identical bits on every rank, pieces larger
than the shared buffers, no file left behind, refusal across hosts, and a rank that never
arrives reported by name instead of hanging. Ranks are threads here (the algorithm does not
care), and real engines in the last test."""

from __future__ import annotations

import pytest
import torch

from lib_dist.cluster import Cluster
from lib_dist.comm import CommTimeout
from lib_dist.comm.fast.all_reduce import SharedMemoryAllReduce
from lib_dist.comm.fast import files
from lib_dist.comm.fast.files import map_shared_files, memory_directory, shared_memory_supported
from lib_dist.errors import RankFailure

from rank_threads import Threads

pytestmark = pytest.mark.timeout(120)


def opened(rank: int, world_size: int, gather, timeout: float,
           capacity: int = 8 << 20) -> SharedMemoryAllReduce | None:
    """This thread rank's end of a shared-memory all-reduce; None if the files cannot be
    shared."""
    files = map_shared_files(rank, world_size, gather, SharedMemoryAllReduce.file_bytes(capacity),
                             "allreduce")
    return None if files is None else SharedMemoryAllReduce(rank, world_size, files, capacity,
                                                            timeout)


def tensors_of(rank: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + length)
    if dtype.is_floating_point:
        return torch.randn(length, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, (length,), generator=g, dtype=dtype)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sums_match_and_every_rank_holds_the_same_bits(world_size):
    # a 256-byte buffer: 1001 float64 take 32 pieces, both halves reused again and again
    lengths, dtypes = [0, 1, 2, 5, 1001], [torch.float64, torch.float32, torch.int64]

    def rank_fn(rank, gather):
        shared = opened(rank, world_size, gather, timeout=30, capacity=256)
        assert shared is not None
        out = {}
        for dtype in dtypes:
            for n in lengths:
                x = tensors_of(rank, n, dtype)
                shared.all_reduce(x)
                out[(dtype, n)] = x
        return out

    results = Threads(world_size).run(rank_fn)
    for dtype in dtypes:
        for n in lengths:
            want = sum(tensors_of(r, n, dtype).double() for r in range(world_size))
            got = [res[(dtype, n)] for res in results]
            assert all(torch.equal(g, got[0]) for g in got), (dtype, n, "ranks disagree")
            tol = 1e-5 if dtype == torch.float32 else 1e-12
            assert torch.allclose(got[0].double(), want, atol=tol), (dtype, n)


def test_nothing_is_left_in_the_shared_directory():
    directory = memory_directory()
    assert directory is not None, "this machine should have /dev/shm or a tmpfs /tmp"
    before = set(directory.glob("lib_dist-allreduce-*"))
    results = Threads(3).run(lambda rank, gather: opened(
        rank, 3, gather, timeout=30, capacity=1024))
    assert all(r is not None for r in results)
    assert set(directory.glob("lib_dist-allreduce-*")) == before


def test_ranks_on_different_hosts_get_none_everywhere():
    def rank_fn(rank, gather):
        def as_if_on_two_hosts(value):
            values = gather(value)
            return [("elsewhere", *v[1:]) if r == 1 and isinstance(v, tuple) else v
                    for r, v in enumerate(values)]
        return opened(rank, 2, as_if_on_two_hosts, timeout=30)

    assert Threads(2).run(rank_fn) == [None, None]


def test_a_rank_that_never_arrives_is_named_after_the_timeout():
    def rank_fn(rank, gather):
        shared = opened(rank, 3, gather, timeout=0.5, capacity=1024)
        if rank == 2:
            return "skipped the all-reduce"
        try:
            shared.all_reduce(torch.ones(10))
        except CommTimeout as e:
            return str(e)

    results = Threads(3).run(rank_fn)
    for rank in (0, 1):
        assert results[rank].startswith(f"rank {rank}: all_reduce (shared memory) waited 0.5 s")
        assert "rank(s) 2 to finish copying its tensor in" in results[rank]


def on_engines(comm, skip_rank):
    import torch

    if comm.rank == skip_rank:
        return "skipped"
    return comm.all_reduce(torch.full((1000,), float(comm.rank)), algorithm="shared_memory")


@pytest.mark.cluster
def test_engines_use_it_and_a_missing_rank_fails_the_run_instead_of_hanging():
    with Cluster(3, timeout=5) as cluster:
        sums = cluster.run(on_engines, None)
        assert all(torch.equal(s, torch.full((1000,), 3.0)) for s in sums)
        with pytest.raises(RankFailure) as failure:
            cluster.run(on_engines, 1, timeout=30)  # longer than the group's 5 s
        text = str(failure.value)
        assert "shared memory" in text and "rank(s) 1" in text
        sums = cluster.run(on_engines, None)  # the cluster still works afterwards
        assert all(torch.equal(s, torch.full((1000,), 3.0)) for s in sums)


@pytest.mark.parametrize("system, machine, supported", [
    ("linux", "x86_64", True), ("linux", "AMD64", True), ("linux", "aarch64", False),
    ("linux", "arm64", False), ("darwin", "arm64", False), ("darwin", "x86_64", False),
    ("win32", "AMD64", False)])
def test_shared_memory_only_on_x86_64_linux(monkeypatch, system, machine, supported):
    """Its ordering between processes rests on x86-64's store order (and /dev/shm is Linux's);
    Apple-silicon and ARM laptops use gloo's sockets."""
    monkeypatch.setattr(files.sys, "platform", system)
    monkeypatch.setattr(files.platform, "machine", lambda: machine)
    assert shared_memory_supported() is supported


def test_where_it_is_not_supported_no_rank_maps_the_files(monkeypatch):
    monkeypatch.setattr(files, "shared_memory_supported", lambda: False)
    got = Threads(2).run(lambda rank, gather: map_shared_files(rank, 2, gather, 1024, "test"))
    assert got == [None, None]


def test_no_room_in_shared_memory_means_none_everywhere():
    """A tmpfs too small for the group's files (a container's 64 MB /dev/shm) is not used:
    touching a page it cannot hold would kill the process with SIGBUS."""
    huge = 1 << 50
    got = Threads(2).run(lambda rank, gather: map_shared_files(rank, 2, gather, huge, "test"))
    assert got == [None, None]
