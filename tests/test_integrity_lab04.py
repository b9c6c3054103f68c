"""Lab 4 cannot be passed with someone else's data parallelism: submissions that import
lib_dist's `DataParallel`, `average_gradients` or `ShardSampler`, subclass them, build on
lib_dist's gradient `Buckets`, subclass torch's `DistributedSampler` or
`DistributedDataParallel`, wrap torch's DDP, build torch's sampler inside their own, or
broadcast with `lib_dist.horovod`, graded for real in the sandbox, score 0 on the questions they
take that way and keep the points of what they wrote themselves, while the solution keeps full
marks (see tests/test_integrity.py for labs 01-03)."""

from __future__ import annotations

import pickle

import nbformat
import pytest
import torch

from grader.course import REPO
from integrity_grading import (catalog, check_blank_release, check_catalog, check_cheat, code,
                               graded_lab)

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

LAB04 = "lab04_data_parallel"
SAMPLER = {"q1-test-torch", "q1-test-shards", "q6-test-cluster"}  # q6 trains on its shards
DATA_PARALLEL = {"q3-test-broadcast", "q4-test-equal", "q4-test-buckets", "q4-test-overlap",
                 "q5-test-no-sync", "q6-test-simulated", "q6-test-cluster"}


def solution_cell(lab: str, grade_id: str) -> str:
    nb = nbformat.read(REPO / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    return next(c.source for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def with_horovods_broadcast(source: str) -> str:
    """The solution's DataParallel, broadcasting with lib_dist.horovod's broadcast_parameters."""
    own = ("        with torch.no_grad():\n"
           "            for t in [*self.module.parameters(), *self.module.buffers()]:\n"
           "                self.comm.broadcast(t.detach(), root)\n")
    horovods = ("        import lib_dist.horovod as hvd\n"
                "        hvd.init(getattr(self.comm, 'comm', self.comm))\n"
                "        hvd.broadcast_parameters([*self.module.parameters(),\n"
                "                                  *self.module.buffers()], root)\n")
    assert own in source, "the solution's broadcast_parameters changed: update this cheat"
    return source.replace(own, horovods)

LAB04_CHEATS = {  # student -> (cells replaced, test cells expected to score 0)
    "imports_lib_dist": ({"q1-solution": "from lib_dist.data_parallel import ShardSampler\n",
                          "q2-solution": "from lib_dist.data_parallel import average_gradients\n",
                          "dp-solution": "from lib_dist.data_parallel import DataParallel\n"},
                         "all"),
    "subclasses_lib_dist": ({"q1-solution": code("""
        import lib_dist.data_parallel
        class ShardSampler(lib_dist.data_parallel.ShardSampler):
            pass
        """), "dp-solution": code("""
        import lib_dist.data_parallel
        class DataParallel(lib_dist.data_parallel.DataParallel):
            pass
        """)}, SAMPLER | DATA_PARALLEL),
    "builds_on_lib_dist_buckets": ({"dp-solution": code("""
        import contextlib
        import torch
        from torch import nn
        from lib_dist.data_parallel import Buckets

        class DataParallel(nn.Module):
            def __init__(self, module, comm, *, bucket_bytes=25 * 2**20, broadcast_from=0):
                super().__init__()
                self.module, self.comm, self.bucket_bytes = module, comm, bucket_bytes
                with torch.no_grad():  # written by the student: Q3 counts
                    for t in [*module.parameters(), *module.buffers()]:
                        comm.broadcast(t.detach(), broadcast_from)
                self.buckets, self.sync, self.queued = None, True, False
                for p in module.parameters():
                    if p.requires_grad:
                        p.register_post_accumulate_grad_hook(self.hook)

            def forward(self, *args, **kwargs):
                return self.module(*args, **kwargs)

            def hook(self, p):
                if not self.sync:
                    return
                if self.buckets is None:  # lib_dist's buckets do the rest
                    self.buckets = Buckets(list(self.module.parameters()), self.comm,
                                           self.bucket_bytes)
                if not self.queued:
                    self.queued = True
                    torch.autograd.Variable._execution_engine.queue_callback(self.end)
                self.buckets.mark_ready(p)

            def end(self):
                self.queued = False
                self.buckets.finish()

            @contextlib.contextmanager
            def no_sync(self):
                self.sync = False
                try:
                    yield
                finally:
                    self.sync = True
        """)}, DATA_PARALLEL - {"q3-test-broadcast"}),
    "subclasses_torchs_sampler": ({"q1-solution": code("""
        from torch.utils.data import DistributedSampler
        class ShardSampler(DistributedSampler):
            def __init__(self, dataset_size, num_replicas, rank, *, shuffle=True, seed=0,
                         drop_last=False):
                super().__init__(range(dataset_size), num_replicas=num_replicas, rank=rank,
                                 shuffle=shuffle, seed=seed, drop_last=drop_last)
        """)}, SAMPLER),
    "subclasses_torchs_ddp": ({"dp-solution": code("""
        from torch.nn.parallel import DistributedDataParallel
        class DataParallel(DistributedDataParallel):
            def __init__(self, module, comm, *, bucket_bytes=25 * 2**20, broadcast_from=0):
                super().__init__(module, bucket_cap_mb=bucket_bytes / 2**20,
                                 find_unused_parameters=True)
        """)}, DATA_PARALLEL),
    "wraps_torchs_ddp": ({"dp-solution": code("""
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel
        class DataParallel(nn.Module):
            def __init__(self, module, comm, *, bucket_bytes=25 * 2**20, broadcast_from=0):
                super().__init__()
                self.ddp = DistributedDataParallel(module, bucket_cap_mb=bucket_bytes / 2**20,
                                                   find_unused_parameters=True)
            def forward(self, *args, **kwargs):
                return self.ddp(*args, **kwargs)
            def no_sync(self):
                return self.ddp.no_sync()
        """)}, DATA_PARALLEL),
    "delegates_to_torchs_sampler": ({"q1-solution": code("""
        from torch.utils.data import DistributedSampler
        class ShardSampler:
            def __init__(self, dataset_size, num_replicas, rank, *, shuffle=True, seed=0,
                         drop_last=False):
                self.dataset_size, self.epoch = dataset_size, 0
                self.options = dict(num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                                    seed=seed, drop_last=drop_last)
            def set_epoch(self, epoch):
                self.epoch = epoch
            def __iter__(self):  # torch's sampler, built here and asked
                torchs = DistributedSampler(range(self.dataset_size), **self.options)
                torchs.set_epoch(self.epoch)
                yield from torchs
            def __len__(self):
                return len(DistributedSampler(range(self.dataset_size), **self.options))
        """)}, SAMPLER),
    "broadcasts_with_horovod": ({"dp-solution": with_horovods_broadcast(
        solution_cell(LAB04, "dp-solution"))}, DATA_PARALLEL),
    # row 4 of the catalog: torch's sampler built and asked around its guard (object.__new__,
    # and inspect.unwrap of the guard's wrappers)
    "oracle_unwrapped": ({"q1-solution": code("""
        import inspect
        from torch.utils.data import DistributedSampler

        def _unguarded(name):
            return inspect.unwrap(getattr(DistributedSampler, name))

        class ShardSampler:
            def __init__(self, dataset_size, num_replicas, rank, *, shuffle=True, seed=0,
                         drop_last=False):
                self.dataset_size, self.epoch = dataset_size, 0
                self.options = dict(num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                                    seed=seed, drop_last=drop_last)
            def torchs(self):
                sampler = object.__new__(DistributedSampler)
                _unguarded("__init__")(sampler, range(self.dataset_size), **self.options)
                _unguarded("set_epoch")(sampler, self.epoch)
                return sampler
            def set_epoch(self, epoch):
                self.epoch = epoch
            def __iter__(self):
                yield from _unguarded("__iter__")(self.torchs())
            def __len__(self):
                return _unguarded("__len__")(self.torchs())
        """)}, SAMPLER),
} | catalog(LAB04)


lab04 = graded_lab(LAB04, LAB04_CHEATS)


@pytest.mark.parametrize("student", sorted(catalog(LAB04)))
def test_the_catalogs_cheats_score_zero(lab04, student):
    check_catalog(lab04, LAB04, student)


@pytest.mark.parametrize("student", sorted(set(LAB04_CHEATS) - set(catalog(LAB04))))
def test_lab04_cheats_score_zero(lab04, student):
    errors = check_cheat(lab04, LAB04, LAB04_CHEATS, student)
    asks = "lab04_data_parallel asks you to write"
    expected = {
        "imports_lib_dist": [f"{asks} ShardSampler yourself: yours is "
                             "lib_dist.data_parallel.ShardSampler",
                             "lib_dist.data_parallel.average_gradients is lib_dist's own version",
                             f"{asks} DataParallel yourself: yours is "
                             "lib_dist.data_parallel.DataParallel"],
        "subclasses_lib_dist": ["yours is lib_dist.data_parallel.ShardSampler, or builds on it",
                                "yours is lib_dist.data_parallel.DataParallel, or builds on it"],
        "builds_on_lib_dist_buckets": ["lib_dist.data_parallel.Buckets.__init__ is lib_dist's "
                                       "own version"],
        "subclasses_torchs_sampler": ["yours is torch.utils.data.DistributedSampler"],
        "subclasses_torchs_ddp": ["yours is torch.nn.parallel.DistributedDataParallel"],
        "wraps_torchs_ddp": [f"{asks} DataParallel yourself: torch.nn.parallel."
                             "DistributedDataParallel is what the tests compare with"],
        "delegates_to_torchs_sampler": [f"{asks} ShardSampler yourself: "
                                        "torch.utils.data.DistributedSampler is what the tests "
                                        "compare with, so your code may not use it"],
        # hvd.init is allowed (its state is not tampering); its broadcast_parameters is off
        "broadcasts_with_horovod": ["lib_dist.horovod.objects.broadcast_parameters is "
                                    "lib_dist's own version, switched off while the lab is "
                                    "graded"],
        "oracle_unwrapped": [f"{asks} ShardSampler yourself: "
                             "torch.utils.data.DistributedSampler is what the tests compare with"],
    }[student]
    for text in expected:
        assert text in errors


def test_sending_a_tensor_to_the_engines_changes_nothing_the_guard_watches():
    """Pickling an instance makes copyreg cache the class's slot names in the class
    (`torch.Tensor.__slotnames__`): Python's doing, not the student's."""
    from lib_dist.integrity.snapshot import Snapshot, classes_of, trusted_modules

    if "__slotnames__" in vars(torch.Tensor):  # pickled before: forget it
        del torch.Tensor.__slotnames__
    modules = trusted_modules()
    snapshot = Snapshot(modules, classes_of(modules))
    pickle.dumps([torch.ones(2), torch.nn.Parameter(torch.zeros(1))])
    assert "__slotnames__" in vars(torch.Tensor)
    assert snapshot.changes() == []


def test_the_blank_release_scores_zero(lab04):
    check_blank_release(lab04)
