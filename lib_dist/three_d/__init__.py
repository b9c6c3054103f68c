"""3D parallelism: data, pipeline and tensor parallelism at once, on a `Mesh` of (dp, pp, tp).

Each rank holds one tensor-parallel slice (module 6) of one pipeline stage (module 5) of one
data-parallel replica (module 4). A step runs the stage's 1F1B schedule on the mesh's `pp`
group, whose blocks all-reduce inside the `tp` group, then averages the gradients over the `dp`
group. Each kind of collective stays inside its own group.

- `model`: `ThreeD`, this rank's piece of module 02's GPT for a layout;
- `step`: `three_d_step`, one training step; `global_loss`, the step's loss on every rank;
- `planner`: every layout of a cluster priced in memory and time per step, fastest first
  (`as_run`: the step as `ThreeD` and `three_d_step` really run it, for `price(...,
  as_run=True)`);
- `checkpoint`: `save` with torch.distributed.checkpoint, each rank its own shards, and `load`
  on any layout (resharded), to go on after a rank dies;
- `resume`: `train`, a run that checkpoints every few steps and, after a rank's death, resumes
  from its last checkpoint on any layout, with the loss curve of a run that never failed.
"""

from .model import Layout, ThreeD
from .step import average_over_replicas, global_loss, replica_batch, three_d_step

__all__ = ["Layout", "ThreeD", "average_over_replicas", "global_loss", "replica_batch",
           "three_d_step"]
