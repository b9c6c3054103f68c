"""Horovod's PyTorch API on lib_dist: `import lib_dist.horovod as hvd` in place of
`import horovod.torch as hvd`, and a Horovod program runs unchanged on the ranks of a
`lib_dist.cluster.Cluster`, with no Horovod build.

    python -m lib_dist.run -np 4 train.py      # as `horovodrun -np 4 python train.py`

Horovod (https://horovod.ai) has had no release since 2023 and does not build against
current torch; its API is still how much training code is written, and a clear picture of
data parallelism: every rank trains a replica on its shard of the data, and the optimizer
averages the gradients over the ranks before each step. Here the same API runs over lib_dist's
communicator (gloo on CPU, NCCL on GPUs, lib_dist's tuned all-reduce), which makes it readable
end to end:

- `basics`: `init`, `shutdown`, `size`, `rank`, local and cross ranks; `built`: what is built;
- `ops`, `gather`, `scatter`: allreduce, allgather, broadcast, alltoall, reducescatter (in
  place `_`, asynchronous `_async` with int handles, `synchronize`, `poll`), `barrier`,
  `join` (uneven batches); `grouped`: their grouped forms; `autograd`: the out-of-place forms,
  differentiable; `sparse`: `sparse_allreduce_async` of sparse COO tensors;
- `objects`: `broadcast_object`, `allgather_object`, `broadcast_parameters`,
  `broadcast_optimizer_state`;
- `optimizer`: `DistributedOptimizer`, its Tensor Fusion (`HOROVOD_FUSION_THRESHOLD`);
- `compression`: `Compression.none`, `Compression.fp16`;
- `timeline`: `HOROVOD_TIMELINE=path` writes a Chrome trace;
- `queue`, `negotiate`: every operation negotiated by name and checked on every rank (a
  mismatch is a `HorovodInternalError` naming the ranks and what differed); `settings`: what
  `init` reads from the environment; `wire`: moving bytes and ragged tensors;
- `process_sets`: `add_process_set`, `remove_process_set`, `process_set=` on every operation;
- `sync_batch_norm`: `SyncBatchNorm`, batch statistics over every rank's batch.

What Horovod has and this does not (Adasum, say) raises, naming itself; any other name
Horovod has and this lacks is an AttributeError saying so.
"""

from .basics import (
    ReduceOp, cross_rank, cross_size, init, is_homogeneous, is_initialized, local_rank,
    local_size, rank, shutdown, size, start_timeline, stop_timeline,
)
from .built import (
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rocm_built,
)
from .autograd import allgather, allreduce, alltoall, broadcast, reducescatter
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .objects import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
)
from .gather import (
    allgather_async, barrier, broadcast_, broadcast_async, broadcast_async_, join,
)
from .ops import (
    Adasum, Average, Max, Min, Product, Sum, allreduce_, allreduce_async, allreduce_async_, poll,
    synchronize,
)
from .grouped import (
    grouped_allgather, grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
    grouped_reducescatter_async,
)
from .negotiate import HorovodInternalError
from .optimizer import DistributedOptimizer
from .scatter import alltoall_async, reducescatter_async
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .sparse import sparse_allreduce_async
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    "Adasum", "Average", "Compression", "Compressor", "DistributedOptimizer", "FP16Compressor",
    "HorovodInternalError",
    "Max", "Min", "NoneCompressor", "ProcessSet", "Product", "ReduceOp", "Sum", "SyncBatchNorm",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
    "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "init", "is_homogeneous",
    "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled",
    "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size",
    "sparse_allreduce_async", "start_timeline", "stop_timeline", "synchronize",
]


def __getattr__(name: str) -> object:
    """A Horovod name this module lacks: say so, and where its list of what is supported is."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"lib_dist.horovod has no {name!r}: lib_dist.horovod does not support "
                         f"it (what it has is listed in lib_dist.horovod.__all__)")
