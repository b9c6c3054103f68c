"""Extension points, and how to reuse a notebook's definitions without running the notebook.

Students extend lib_dist in two ways: by subclassing a base class, or by writing a function with
a given signature that lib_dist (or a later lab) calls. This docstring is the one list of them.

Base classes
------------
- `lib_dist.comm.base.Communicator`: one rank's endpoint (send/recv, isend/irecv, barrier and
  the collectives). A backend implements `_post_send`, `_post_recv`, `world_barrier`; labs
  override the collectives (`broadcast`, `all_reduce`, `all_gather`, `reduce_scatter`).
- `lib_dist.optim.Optimizer`: an optimizer; a subclass implements
  `update(self, p, grad, state, group) -> None`, changing `p` in place (see
  `lib_dist.optim.base` for the contract). Any instance works where a `torch.optim` optimizer
  does.
- `lib_dist.horovod.Compressor`: `compress(tensor) -> (tensor, ctx)` and
  `decompress(tensor, ctx) -> tensor` (static methods), what `hvd.allreduce` and
  `hvd.DistributedOptimizer` take as `compression`; `Compression.fp16` is one. The gradient
  buckets of `lib_dist.data_parallel.Buckets` take any object with those two methods.

Functions
---------
- `lib_dist.train.step.StepFn`: `step(model, optimizer, x, y, loss_fn) -> float`, one
  optimization step on the batch (x, y) returning its mean loss; `lib_dist.train.train(...,
  step=...)` calls it every step. The default is `lib_dist.train.train_step`.
- A loss: `loss_fn(output, target) -> scalar tensor`, what `train`, `evaluate` and every step
  take; `lib_dist.losses.cross_entropy` is the reference.

What each lab asks for (the notebooks in `labs/`; their solutions are in `solutions/`)
---------------------------------------------------------------------------------------
`LABS` (`lib_dist.labs`) declares the same, for the grader: the names each lab's notebook must
define, and lib_dist's own versions of them, which are switched off while the lab is graded
(`lib_dist.integrity`), so that importing them earns nothing. A new lab adds one entry.

- lab00_ranks: `square_of_rank(comm) -> int`, `sum_over_ranks(comm, value) -> float`,
  `shift_right(comm, t) -> Tensor`, `swap_with_partner(comm, t) -> Tensor`,
  `mean_over_ranks(comm, t) -> Tensor`.
- lab01_cross_entropy: `log_softmax(logits, dim=-1) -> Tensor`;
  `CrossEntropy(torch.autograd.Function)` with a hand-written `backward`, and
  `cross_entropy(logits, target, reduction="mean", ignore_index=-100) -> Tensor`, the same
  contract as `lib_dist.losses.cross_entropy`;
  `binary_cross_entropy_with_logits(logit, target, reduction="mean") -> Tensor`.
- lab02_training: `SGD(params, lr, momentum=0.0, weight_decay=0.0)` and
  `AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)`, both
  `lib_dist.optim.Optimizer`s matching `torch.optim.SGD` / `torch.optim.AdamW`;
  `accumulated_step(model, optimizer, x, y, loss_fn, micro_batches=1, ignore_index=-100)
  -> float`, a `StepFn` (with `functools.partial` for `micro_batches`) weighting each
  micro-batch by its share of the targets not equal to `ignore_index`.
- lab03_collectives, from `comm.send`/`recv`/`isend`/`irecv` only, for any world size, length
  and floating dtype: `broadcast(comm, tensor, root=0) -> Tensor` (in place, returns `tensor`);
  `all_gather(comm, tensor) -> list[Tensor]` (new tensors, by rank);
  `reduce_scatter(comm, tensor, op="sum") -> Tensor` (this rank's `chunk_bounds` chunk of the
  reduced, flattened tensor, new); `ring_all_reduce(comm, tensor, op="sum") -> Tensor` (in
  place, returns `tensor`; 2(N-1) messages of one chunk per rank). Their signatures are the
  `Communicator` collectives' with `comm` first; `benchmarks/allreduce.py` times the
  instructor's `ring_all_reduce`.
- lab04_data_parallel, on `comm`'s `broadcast`, `all_reduce` and `all_reduce_async`:
  `average_gradients(comm, model) -> None`, one `all_reduce(p.grad, "avg")` per parameter
  with a gradient; `ShardSampler(dataset_size, num_replicas, rank, *, shuffle=True, seed=0,
  drop_last=False)` with `set_epoch(epoch)`, `__iter__` and `__len__`, the indices of
  `torch.utils.data.DistributedSampler`; `DataParallel(module, comm, *, bucket_bytes=25 MiB,
  broadcast_from=0)`, an `nn.Module` after whose `loss.backward()` every `p.grad` is the
  average over the ranks, with `no_sync()` for accumulation and frozen, tied and unused
  parameters handled as one process would. The lab gives the skeleton (the buckets of the
  lab's `plan_buckets`, the post-accumulate-grad hooks and the end-of-backward callback);
  students write `broadcast_parameters(root)`, `new_step()`, `grad_ready(p)` (start every
  full bucket, in order, with one `all_reduce_async` of its gradients and a used-flag per
  parameter), `start_bucket(k)`, `finish()` (wait, write back, None where no rank had a
  gradient) and `no_sync()`. lib_dist's versions are in `lib_dist.data_parallel` (whose
  `DataParallel` also keeps a `timeline` of each step); they are switched off while the lab
  is graded, `Buckets` included, and with it `lib_dist.horovod`'s `DistributedOptimizer`; so
  are `lib_dist.horovod`'s `broadcast_parameters` and `broadcast_optimizer_state`.
  `benchmarks/data_parallel.py` times the instructor's `DataParallel`.
- lab05_pipeline, on `comm.isend`/`recv` and the given `lib_dist.pipeline.Stage`:
  `split_model(layers, p, costs=None) -> list[nn.Sequential]` (consecutive, non-empty,
  minimising the largest stage cost, parameter counts by default); `send_forward(comm, stage,
  activation)` / `send_backward(comm, stage, grad)` (an `isend` to the next / previous stage,
  returning its handle, None at the pipeline's end) and `recv_forward(comm, stage,
  micro_batch_size)` / `recv_backward(...)` (into `stage.receive_buffer`); `gpipe_step(comm,
  stage, inputs, targets, m)` and `one_f_one_b_step(...)`, one training step returning the mean
  loss on the last stage (None elsewhere) and leaving one process's gradients. lib_dist's
  versions, and its schedules (`gpipe`, `one_f_one_b`, `naive`, `torch_schedule`,
  `run_schedule`), are in
  `lib_dist.pipeline` and are switched off while the lab is graded;
  `benchmarks/pipeline.py` times lib_dist's steps against `torch.distributed.pipelining`.
- lab06_tensor_parallel, on `comm.all_reduce` and `comm.all_gather`: `CopyToRanks` and
  `ReduceFromRanks`, `torch.autograd.Function`s called as `Op.apply(x, comm)` (f: identity
  forward, all-reduce backward; g: the converse); `ColumnParallelLinear(linear, comm,
  gather_output=False)` and `RowParallelLinear(linear, comm)`, `nn.Module`s keeping this rank's
  block of a full `nn.Linear`'s rows / columns as `weight` and `bias` (a row-parallel bias
  whole, added after the all-reduce); `ParallelMLP(mlp, comm)` (`fc`, `proj`) and
  `ParallelAttention(attn, comm)` (`qkv` holding this rank's heads' query, key and value
  rows, `proj`, `n_head`) from module 02's `FeedForward` and `CausalSelfAttention`;
  `vocab_parallel_cross_entropy(logits, target, comm, ignore_index=-100)`, the mean
  cross-entropy from this rank's (N, V/tp) slice of the logits. lib_dist's versions are in
  `lib_dist.tensor_parallel` and are switched off while the lab is graded; torch's own plans
  (`parallelize_module`, `ColwiseParallel`, `RowwiseParallel`), which the tests compare with,
  refuse to run inside the student's code. `benchmarks/tensor_parallel.py` times lib_dist's
  blocks against torch's.
- lab07_mixed_precision: `LossScaler(init_scale=2.0**16, growth_factor=2.0,
  backoff_factor=0.5, growth_interval=2000)` with `scale`, `unscale_`, `step`, `update`,
  `get_scale`, `state_dict`, making `torch.amp.GradScaler`'s decisions (skipped steps, scale
  sequence) and unscaling half-precision gradients too; `MasterWeights(params,
  optimizer_class, **hyperparameters)`, an optimizer over fp32 copies of the parameters
  (`param_groups`, `step`, `zero_grad`); `DistributedLossScaler(comm, **scaler_arguments)`,
  whose ranks skip together (one all-reduce of a flag); `ZeroOptimizer(params, comm,
  optimizer_class, **hyperparameters)`, ZeRO stage 1 on `comm.reduce_scatter` and
  `comm.all_gather` (`shard`, `optimizer`, `reduce_gradients`, `step`, `param_groups`,
  `zero_grad`). lib_dist's versions are in `lib_dist.mixed_precision` and are switched off
  while the lab is graded; `GradScaler`, its private kernels (`torch._amp_update_scale_`,
  `torch._amp_foreach_non_finite_check_and_unscale_`) and
  `torch.distributed.optim.ZeroRedundancyOptimizer`, which the tests compare with, refuse to
  run inside the student's code. `benchmarks/mixed_precision.py` times lib_dist's scaler
  against GradScaler and its ZeRO optimizer against data parallel.

- lab08_parameter_server, on `comm.send`/`recv`/`isend`/`irecv` (and `comm.all_reduce` for
  local SGD): `serve(comm, shard, workers, steps, lr, mode="sync", schedule=None,
  lr_for_staleness=None) -> [(worker, staleness), ...]`, a parameter server's rank,
  synchronous (the mean of every worker's gradient once a step) or asynchronous (each gradient
  as it arrives, or in a `schedule`'s order, its staleness recorded); `work(comm, model,
  servers, steps, batch_fn, loss_fn) -> losses`, a worker that pulls, computes and pushes;
  `local_sgd(comm, model, optimizer, batch_fn, loss_fn, steps, every, weight=1.0)`, local SGD
  / FedAvg; `gossip_step(comm, tensor)`, one average with the ring neighbours;
  `TopK(ratio, error_feedback=True)` with `k`, `compress`, `decompress` and `residual`.
  lib_dist's versions are in `lib_dist.parameter_server` and are switched off while the lab is
  graded; `replay_async`, which the tests compare an asynchronous server with, refuses to run
  inside the student's code. `benchmarks/parameter_server.py` times lib_dist's server against
  data parallel's ring all-reduce.
- lab09_fitting_the_model: `Recompute(torch.autograd.Function)` applied as
  `Recompute.apply(fn, *inputs)` (forward under `no_grad` saving only the inputs and the CPU
  generator's state; backward running `fn` again with that state replayed and the generator
  left as it was), `checkpoint(fn, *inputs)` and `Checkpointed(block)`; `Zero2Optimizer(params,
  comm, optimizer_class, bucket_bytes=1 MiB, **hyperparameters)` on `comm.reduce_scatter` and
  `comm.all_gather`, ZeRO stage 2 (the lab gives the buckets of `plan_buckets`; students write
  the shards, the post-accumulate-grad hook `grad_ready`, `reduce`, `step`, `zero_grad`); and
  FSDP (the lab gives `shard_module`, `Unit`'s views and binding, `FSDP`'s hooks, saved-tensor
  packing and `full_state_dict`; students write `Gathered`, all-gather forward and
  reduce-scatter backward, `Unit`'s shard and `saved_again`, `FSDP.gather` and
  `FSDP.release`), with its prefetch (`FSDP(..., prefetch=True)`: students write
  `Prefetcher`'s `start`, `settle` and `take` on `comm.all_gather_async`, and `next_unit(fsdp,
  unit, backward)`, the order of the units in each pass). lib_dist's versions are in `lib_dist.recompute` and `lib_dist.sharding`
  and are switched off while the lab is graded; `torch.utils.checkpoint`, lib_dist's
  `TorchCheckpointed`, torch's FSDP2 (`fully_shard`) and `torch_fully_sharded`, which the tests
  compare with, refuse to run inside the student's code. `benchmarks/fsdp.py` times lib_dist's
  FSDP against FSDP2.
- lab10_long_sequences, on `comm.isend`/`irecv`, `comm.all_to_all`, `comm.all_gather`,
  `comm.reduce_scatter` and `comm.all_reduce`: `zigzag_positions(seq_len, world_size, rank)`,
  the zig-zag split's positions (chunks r and 2N - 1 - r of 2N); `fold(q, k, v, allowed,
  scale, m, total, acc)`, one K/V block folded into the running maximum, sum and weighted
  values of the online softmax; `ring_forward(q, k, v, comm, seq_len) -> (out, lse)`, causal
  ring attention, each step's K/V exchange posted before its compute (the lab gives
  `RingAttention`, whose backward goes around the ring again, and `ring_attention`; lib_dist's
  `visible_pairs` is not switched off); `exchange_rows(x,
  comm, send, recv)` and `Exchange(torch.autograd.Function)`, expert parallelism's all-to-all
  of rows and its reverse, and `ExpertParallelMoE`'s `splits(fits)`, dispatch and combine (the
  lab gives the routing, the gathered counts and the experts' run); sequence parallelism's
  `all_gather_sequence(x, comm)`, `reduce_scatter_sequence(x, comm)`, `GatherSequence`,
  `ScatterSequence` and `SequenceParallelBlock`'s `enter`, `leave` and
  `sync_replicated_gradients` (the lab gives the block on module 6's `ParallelAttention` and
  `ParallelMLP`). lib_dist's versions are in `lib_dist.context_parallel`, `lib_dist.experts`
  and `lib_dist.tensor_parallel.sequence` (with `lib_dist.comm.autograd.Transposed`, the
  differentiable exchange they share) and are switched off while the lab is graded; torch's
  `scaled_dot_product_attention`, module 6's `ParallelBlock` and one process's `MoE`, which the
  tests compare with, refuse to run inside the student's code. `benchmarks/long_context.py`
  times lib_dist's ring attention against all-gathered K/V and its MoE step against torch's
  `all_to_all_single`.
- lab11_capstone, on `lib_dist.comm.mesh.split`, module 5's `one_f_one_b_step`, module 6's
  `ParallelBlock` and `lib_dist.three_d.checkpoint`'s `save` and `load`:
  `coordinates_of(rank, layout)`, a rank's (d, p, t) in the (dp, pp, tp) grid, tp fastest;
  `mesh_groups(comm, layout)`, its dp, pp and tp groups by `split`; `replica_share(inputs,
  targets, dp)`, `average_over_replicas(parameters, dp)`, `global_loss(replica_loss, stage,
  pp, dp)` and `three_d_step(piece, optimizer, inputs, targets, m)`, one 3D-parallel step (the
  lab gives `Piece`, a rank's stage of tensor-parallel blocks built on the student's groups);
  `latest_complete(run)` and `train(comm, layout, run, steps, every, m, before_step)`, a run
  that checkpoints and starts again from its last complete checkpoint on any layout.
  lib_dist's versions (`lib_dist.comm.mesh.Mesh`, `lib_dist.three_d`) are switched off while
  the lab is graded.

Reusing definitions
-------------------
`definitions(notebook, *names)` (`lib_dist.definitions`) loads named definitions from a notebook
without running the rest of it: a later lab reuses a student's earlier work this way.

Students' answers as lib_dist's own
-----------------------------------
`lib_dist.registry.use_my_answers(labs folder)` loads a student's answers with `definitions` and
makes them what lib_dist uses in that process: lab03's `ring_all_reduce` becomes
`comm.all_reduce(t, op, algorithm="mine")`, lab04's `ShardSampler` and `DataParallel` replace
`lib_dist.data_parallel`'s (`implementation(name)`), lab05's `split_model` and
`one_f_one_b_step` and lab06's `ParallelMLP` and `ParallelAttention` (which module 6's
`ParallelBlock` is built of) likewise; a missing one names the lab that writes it. Labs 10 and
11 take those with `earlier_answers("..", *names)`: lib_dist's reference, or in the student
edition (no references) the student's own.
`Lab.uses`: what a graded lab takes from the student's earlier labs under `autograde
--own-answers` (by default, the reference).
"""

from __future__ import annotations

from .definitions import FALLBACK, Definitions, MissingDefinition, definitions
from .labs import LABS, Lab

__all__ = ["FALLBACK", "LABS", "Definitions", "Lab", "MissingDefinition", "definitions"]
