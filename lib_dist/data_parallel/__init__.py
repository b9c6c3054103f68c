"""lib_dist's own synchronous data parallelism: replicate the model, shard the data, average
the gradients. One subpackage for the strategy, with its communication beside it:

- `ShardSampler` (`sampler`): which examples each rank trains on;
- `average_gradients` (`naive`): one all-reduce per parameter after backward, the first
  version to write;
- `broadcast_parameters` (`broadcast`): every replica starts from one rank's parameters;
- `Buckets` (`buckets`): gradients fused into buffers whose all-reduces start during backward
  (also what `lib_dist.horovod` builds its `DistributedOptimizer` and Tensor Fusion on);
- `DataParallel` (`wrapper`): the model wrapper that does all of it inside `loss.backward()`,
  with `no_sync()` for gradient accumulation;
- `Timeline` (`timeline`): what each step did when, to check and draw the overlap.
"""

from .broadcast import broadcast_parameters, broadcast_tensors, check_replicas_match
from .buckets import Bucket, Buckets, Compressor, plan_buckets
from .naive import average_gradients
from .sampler import ShardSampler
from .timeline import Mark, Span, StepLog, Timeline
from .wrapper import DEFAULT_BUCKET_BYTES, DataParallel

__all__ = [
    "DEFAULT_BUCKET_BYTES", "Bucket", "Buckets", "Compressor", "DataParallel", "Mark",
    "ShardSampler", "Span", "StepLog", "Timeline", "average_gradients", "broadcast_parameters",
    "broadcast_tensors", "check_replicas_match", "plan_buckets",
]
