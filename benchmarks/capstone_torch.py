"""The capstone's model and layout built from torch's own parts, the baseline of its step time.

On a (dp, pp, tp) `DeviceMesh` of the whole group (tp fastest, as lib_dist's `Mesh`), each rank
takes the same stage of module 2's GPT that `lib_dist.three_d.ThreeD` gives it (the same
layers, cut by the same balanced bounds) and builds it with torch's parts only:

- tensor parallelism: each block's attention and MLP through `parallelize_module` with
  `ColwiseParallel` / `RowwiseParallel` over the mesh's tp dimension
  (`lib_dist.tensor_parallel.dtensor`'s plan: q, k, v and fc column-wise, the two projections
  row-wise); the embedding and the head whole on each tp rank, as lib_dist keeps them;
- data parallelism: FSDP2's `fully_shard` over the dp dimension, on each layer and on the
  stage (`reshard_after_forward=False`: each layer's parameters gathered once a step, the
  gradients reduce-scattered), the data-parallel wrapper torch's pipelining composes with;
- pipeline parallelism: `torch.distributed.pipelining`'s `PipelineStage` over the pp
  dimension's group, run by `Schedule1F1B` (m micro-batches; with one stage, the same
  schedule runs them one after the other).

Every part works on CPU ranks with gloo in torch 2.13, in all five layouts; DDP does not,
under the pipeline. `DistributedDataParallel(device_mesh=mesh["dp"])` fails at (2, 4, 1),
whose first stage is the embedding alone, in its first step: "params_.size() ==
rebuilt_param_indices_.size() INTERNAL ASSERT FAILED ... Original model param size is: 2
versus rebuilt params size of: 4" (rebuilding its buckets, it counted each parameter once per
micro-batch's backward). With `static_graph=True` it runs, but wherever pp > 1 it leaves the
gradients unaveraged: the replicas' losses drift from one process's ((2, 2, 2): their mean
3.92 against 4.05 after a dozen steps), where with FSDP2 the replicas' mean loss is
lib_dist's, every layout. The benchmark prints both losses.

Sent to the engines by value (cloudpickle), as `rounds.py` is.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def torch_stage_module(config: Any, shape: tuple[int, int, int], mesh: Any) -> Any:
    """This rank's stage of the GPT, its blocks tensor-parallel over `mesh["tp"]`."""
    from torch import nn

    from lib_dist.models.gpt import Block
    from lib_dist.pipeline import balanced_bounds, gpt_layers, parameter_count
    from lib_dist.tensor_parallel.dtensor import torch_parallel_attention, torch_parallel_mlp

    dp, pp, tp = shape
    layers = gpt_layers(config, seed=0)
    bounds = balanced_bounds([parameter_count(layer) for layer in layers], pp)
    first, end = bounds[mesh["pp"].get_local_rank()]
    mine = layers[first:end]
    if tp > 1:
        for layer in mine:
            if isinstance(layer, Block):  # the parallel copies take the originals' places
                setattr(layer, "attn", torch_parallel_attention(layer.attn, mesh["tp"]))
                setattr(layer, "mlp", torch_parallel_mlp(layer.mlp, mesh["tp"]))
    return nn.Sequential(*mine)


def torch_composition(config: Any, shape: tuple[int, int, int], m: int,
                      micro_batch: int) -> tuple[Callable[[Any, Any], float | None], Any]:
    """(step(inputs, targets), optimizer) of this rank's piece of the torch-built 3D GPT:
    step takes the global batch and runs one 1F1B training step of this rank's replica."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from lib_dist.pipeline import next_token_loss

    dp, pp, tp = shape
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "pp", "tp"))
    module = torch_stage_module(config, shape, mesh)
    if dp > 1:
        for layer in module:
            fully_shard(layer, mesh=mesh["dp"], reshard_after_forward=False)
        fully_shard(module, mesh=mesh["dp"], reshard_after_forward=False)
    pp_rank = mesh["pp"].get_local_rank()
    stage = PipelineStage(module, pp_rank, pp, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=next_token_loss)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    dp_rank = mesh["dp"].get_local_rank()

    def step(inputs: Any, targets: Any) -> float | None:
        share = len(inputs) // dp
        x = inputs[dp_rank * share:(dp_rank + 1) * share]
        y = targets[dp_rank * share:(dp_rank + 1) * share]
        optimizer.zero_grad()
        losses: list[Any] = []
        if pp == 1:
            schedule.step(x, target=y, losses=losses)
        elif pp_rank == 0:
            schedule.step(x)
        elif pp_rank == pp - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        optimizer.step()
        return float(sum(losses) / len(losses)) if losses else None

    return step, optimizer
