"""What each lab asks students to write, for the grader: `LABS`, one `Lab` per lab.

`lib_dist.extend`'s docstring says the same in prose, with every other extension point; a new
lab adds its paragraph there and its entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lab:
    """What a lab asks students to write.

    asks: the top-level names the student's notebook defines; graded tests see these and
        nothing else of the student's code.
    references: lib_dist's own versions of them, as "module:qualname", switched off while
        the lab is graded: a call raises `lib_dist.integrity.AskedToWrite`.
    oracles: what the tests compare an answer with (or what the student edition runs in its
        place, `lib_dist.stand_ins`), as "module:qualname"; an answer that is
        one of them, or a subclass of one, is not taken while the lab is graded, and the
        student's code may not build or call one while an answer runs
        (`lib_dist.integrity.oracles`); the tests themselves use them freely.
    engines: whether the notebook starts a `lib_dist.cluster.Cluster` of local engines; the
        grader then starts their host with the kernel (`lib_dist.cluster.standby`).
    preload: modules imported ahead, once, for the kernel and that host to share, rather than
        by every engine on its own, e.g. `torch._dynamo`, which a first torch.optim step
        imports (over a CPU-second per process).
    uses: earlier labs' answers (names in their `asks`) this lab's graded run takes from the
        student's own submissions under `autograde --own-answers`: the judge registers them
        (`lib_dist.registry`; a ring becomes `Communicator.all_reduce`'s default there).
    """

    asks: tuple[str, ...]
    references: tuple[str, ...] = ()
    oracles: tuple[str, ...] = ()
    engines: bool = False
    preload: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()


# all_reduce's default, not all_reduce: it runs a student's registered ring (lib_dist.registry)
_COLLECTIVES = ("broadcast", "all_gather", "reduce_scatter", "_default_all_reduce")

LABS: dict[str, Lab] = {
    "lab00_ranks": Lab(("square_of_rank", "sum_over_ranks", "shift_right", "swap_with_partner",
                        "mean_over_ranks"), engines=True),
    "lab01_cross_entropy": Lab(
        ("log_softmax", "CrossEntropy", "cross_entropy", "binary_cross_entropy_with_logits"),
        ("lib_dist.losses:log_softmax", "lib_dist.losses:cross_entropy",
         "lib_dist.losses:binary_cross_entropy_with_logits")),
    "lab02_training": Lab(("SGD", "AdamW", "accumulated_step"),
                          oracles=("torch.optim:SGD", "torch.optim:AdamW", "torch.optim:Adam")),
    "lab03_collectives": Lab(
        ("broadcast", "all_gather", "reduce_scatter", "ring_all_reduce"),
        ("lib_dist.comm.algorithms:ring", "lib_dist.comm.algorithms:gather_broadcast",
         *(f"lib_dist.comm:{cls}.{op}" for cls in ("Communicator", "TorchCommunicator")
           for op in _COLLECTIVES)),
        # what the student edition runs in their place (Bruck's rounds, torch's own): correct
        # collectives, but not the lab's, and not the student's
        oracles=tuple(f"lib_dist.comm.stand_ins:{name}" for name in (
            "broadcast", "all_gather", "reduce_scatter", "all_reduce", "native_all_reduce",
            "_all_reduce", "_bruck_gather", "_bruck_scatter")),
        engines=True),
    "lab04_data_parallel": Lab(
        ("ShardSampler", "average_gradients", "DataParallel"),
        ("lib_dist.data_parallel:average_gradients",
         "lib_dist.data_parallel:broadcast_parameters", "lib_dist.data_parallel:broadcast_tensors",
         *(f"lib_dist.data_parallel:ShardSampler.{method}"
           for method in ("__init__", "set_epoch", "ordering", "__iter__", "__len__")),
         *(f"lib_dist.data_parallel:DataParallel.{method}"
           for method in ("__init__", "forward", "no_sync", "_on_grad_ready", "_end_of_backward")),
         *(f"lib_dist.data_parallel:Buckets.{method}"  # the buckets are what the lab asks for
           for method in ("__init__", "mark_ready", "finish")),
         "lib_dist.data_parallel:Bucket.gather_grads",
         "lib_dist.data_parallel:Bucket.scatter_grads",
         # lib_dist.horovod's broadcast of a model's tensors (and its fused broadcast, which
         # broadcast_optimizer_state uses too); its allreduce_ is an all-reduce, as comm's
         "lib_dist.horovod.objects:broadcast_parameters",
         "lib_dist.horovod.objects:broadcast_tensors"),
        oracles=("torch.nn.parallel:DistributedDataParallel",
                 "torch.utils.data:DistributedSampler", "lib_dist.data_parallel:DataParallel",
                 "lib_dist.data_parallel:ShardSampler"),
        engines=True, preload=("torch._dynamo",), uses=("ring_all_reduce",)),
    "lab05_pipeline": Lab(
        ("split_model", "send_forward", "recv_forward", "send_backward", "recv_backward",
         "gpipe_step", "one_f_one_b_step"),
        tuple(f"lib_dist.pipeline:{name}" for name in (
            "split_model", "balanced_bounds", "send_forward", "recv_forward", "send_backward",
            "recv_backward", "run_schedule", "gpipe_step", "one_f_one_b_step", "gpipe",
            "one_f_one_b", "naive", "torch_schedule")),
        engines=True, preload=("sympy",)),
    "lab06_tensor_parallel": Lab(
        ("CopyToRanks", "ReduceFromRanks", "ColumnParallelLinear", "RowParallelLinear",
         "ParallelMLP", "ParallelAttention", "vocab_parallel_cross_entropy"),
        (*(f"lib_dist.tensor_parallel:{cls}.{method}" for cls in (
            "CopyToRanks", "ReduceFromRanks", "GatherFromRanks", "LinearOverlapped",
            "VocabParallelCrossEntropy") for method in ("forward", "backward")),
         *(f"lib_dist.tensor_parallel:{cls}.{method}" for cls in (
             "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelAttention",
             "VocabParallelEmbedding", "TensorParallelGPT")
           for method in ("__init__", "forward")),
         *(f"lib_dist.tensor_parallel:{name}" for name in (
             "copy_to_ranks", "reduce_from_ranks", "gather_from_ranks", "linear_overlapped",
             "shard", "vocab_parallel_cross_entropy"))),
        oracles=("torch.distributed.tensor.parallel:ColwiseParallel",
                 "torch.distributed.tensor.parallel:RowwiseParallel",
                 "torch.distributed.tensor.parallel:parallelize_module",
                 "torch.distributed.tensor.parallel.api:parallelize_module",
                 "lib_dist.tensor_parallel.dtensor:torch_parallel_mlp",
                 "lib_dist.tensor_parallel.dtensor:torch_parallel_attention"),
        engines=True, preload=("torch._dynamo",)),
    "lab07_mixed_precision": Lab(
        ("LossScaler", "MasterWeights", "DistributedLossScaler", "ZeroOptimizer"),
        (*(f"lib_dist.mixed_precision:LossScaler.{method}" for method in (
            "__init__", "scale", "unscale_", "agree", "step", "update", "get_scale",
            "state_dict", "load_state_dict")),
         *(f"lib_dist.mixed_precision:MasterWeights.{method}" for method in (
             "__init__", "zero_grad", "step", "state_dict", "load_state_dict")),
         "lib_dist.mixed_precision:DistributedLossScaler.__init__",
         "lib_dist.mixed_precision:DistributedLossScaler.agree",
         *(f"lib_dist.mixed_precision:ZeroOptimizer.{method}" for method in (
             "__init__", "reduce_gradients", "step", "zero_grad"))),
        oracles=("torch.amp:GradScaler", "torch.amp.grad_scaler:GradScaler",
                 "torch:_amp_update_scale_", "torch:_amp_foreach_non_finite_check_and_unscale_",
                 "torch.distributed.optim:ZeroRedundancyOptimizer"),
        engines=True, preload=("torch._dynamo",), uses=("ring_all_reduce",)),
    "lab08_parameter_server": Lab(
        ("serve", "work", "local_sgd", "gossip_step", "TopK"),
        (*(f"lib_dist.parameter_server:{name}" for name in (
            "serve", "work", "pull", "parameter_server", "local_sgd", "average_parameters",
            "gossip_step", "dpsgd_step")),
         *(f"lib_dist.parameter_server.server:{name}" for name in (
             "_serve_synchronously", "_serve_asynchronously", "_in_order", "_first_come")),
         *(f"lib_dist.parameter_server:TopK.{method}" for method in (
             "__init__", "k", "compress", "decompress"))),
        oracles=("lib_dist.parameter_server:replay_async",),
        engines=True, preload=("torch._dynamo",)),
    "lab09_fitting_the_model": Lab(
        ("Recompute", "checkpoint", "Checkpointed", "Zero2Optimizer", "Gathered", "Unit",
         "shard_module", "FSDP", "Prefetcher", "next_unit"),
        ("lib_dist.recompute:Recompute.forward", "lib_dist.recompute:Recompute.backward",
         "lib_dist.recompute:checkpoint", "lib_dist.recompute:Checkpointed.forward",
         "lib_dist.recompute:checkpoint_blocks", "lib_dist.recompute:replayed",
         *(f"lib_dist.sharding.zero2:Zero2Optimizer.{method}" for method in (
             "__init__", "_on_grad_ready", "_reduce", "step", "zero_grad")),
         "lib_dist.sharding.zero2:Bucket.__init__", "lib_dist.sharding.zero2:Bucket.my_chunk",
         "lib_dist.sharding.zero2:Bucket.hold_parameters",
         "lib_dist.sharding.fsdp:Gathered.forward", "lib_dist.sharding.fsdp:Gathered.backward",
         *(f"lib_dist.sharding.fsdp:Unit.{method}" for method in (
             "__init__", "gather", "saved_again")),
         *(f"lib_dist.sharding.fsdp:FSDP.{method}" for method in (
             "__init__", "forward", "full_state_dict", "_gather", "_release", "_pack",
             "_unpack")),
         "lib_dist.sharding.fsdp:_shard", "lib_dist.sharding.fsdp:FSDP._before",
         *(f"lib_dist.sharding.prefetch:Prefetcher.{method}" for method in (
             "start", "settle", "take", "clear"))),
        oracles=("torch.utils.checkpoint:checkpoint", "lib_dist.recompute:TorchCheckpointed",
                 "torch.distributed.fsdp:fully_shard",
                 "lib_dist.sharding.fsdp:torch_fully_sharded"),
        engines=True, preload=("torch._dynamo",)),
    "lab10_long_sequences": Lab(
        ("zigzag_positions", "fold", "ring_forward", "exchange_rows", "Exchange",
         "ExpertParallelMoE", "all_gather_sequence", "reduce_scatter_sequence",
         "GatherSequence", "ScatterSequence", "SequenceParallelBlock"),
        ("lib_dist.context_parallel.layout:Layout.positions",
         "lib_dist.context_parallel.ring:ring_attention",
         "lib_dist.context_parallel.ring:RingAttention.forward",
         "lib_dist.context_parallel.ring:RingAttention.backward",
         "lib_dist.context_parallel.ring:_fold",
         *(f"lib_dist.context_parallel.gathered:{name}" for name in (
             "all_gather_sequence", "reduce_scatter_sequence", "gather_sequence",
             "scatter_sequence", "gathered_attention")),
         "lib_dist.context_parallel.ulysses:ulysses_attention",
         "lib_dist.comm.autograd:Transposed.forward", "lib_dist.comm.autograd:Transposed.backward",
         *(f"lib_dist.experts.exchange:{name}" for name in (
             "exchange_rows", "dispatch", "combine", "_exchanged")),
         *(f"lib_dist.experts.parallel:ExpertParallelMoE.{method}" for method in (
             "__init__", "forward", "_gather", "_run_experts")),
         *(f"lib_dist.tensor_parallel.sequence:SequenceParallelBlock.{method}" for method in (
             "__init__", "forward", "_enter", "_leave", "_attention", "_mlp",
             "sync_replicated_gradients"))),
        oracles=("torch.nn.functional:scaled_dot_product_attention",
                 "lib_dist.tensor_parallel:ParallelBlock", "lib_dist.experts.moe:MoE"),
        engines=True, preload=("torch._dynamo",), uses=("ParallelAttention", "ParallelMLP")),
    "lab11_capstone": Lab(
        ("coordinates_of", "mesh_groups", "replica_share", "average_over_replicas",
         "global_loss", "three_d_step", "latest_complete", "train"),
        ("lib_dist.comm.mesh:Mesh.__init__", "lib_dist.comm.mesh:coordinates",
         "lib_dist.comm.mesh:rank_of", "lib_dist.three_d.model:ThreeD.__init__",
         *(f"lib_dist.three_d.step:{name}" for name in (
             "replica_batch", "average_over_replicas", "three_d_step", "global_loss")),
         "lib_dist.three_d.checkpoint:latest"),
        engines=True, preload=("torch._dynamo", "torch.distributed.checkpoint"),
        uses=("split_model", "one_f_one_b_step", "ParallelAttention", "ParallelMLP")),
}


__all__ = ["LABS", "Lab"]
