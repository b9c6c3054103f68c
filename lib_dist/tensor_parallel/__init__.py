"""Tensor parallelism, Megatron-style: every rank holds a slice of each layer's matrices.

- `functions`: the conjugate operators f (`copy_to_ranks`: identity forward, all-reduce
  backward) and g (`reduce_from_ranks`: all-reduce forward, identity backward),
  `gather_from_ranks`, and `linear_overlapped` (f and a linear layer whose backward overlaps
  the all-reduce with the weight gradient);
- `layers`: `ColumnParallelLinear`, `RowParallelLinear`, built from a full `nn.Linear`;
  `shard` / `unshard`;
- `blocks`: the GPT's MLP, attention (by heads) and transformer block, tensor-parallel;
- `sequence`: the same block with sequence parallelism (Megatron-SP) where tensor parallelism
  keeps activations whole: all-gather and reduce-scatter along the sequence (module 10);
- `vocab`: the embedding and the cross-entropy split by vocabulary;
- `gpt`: `TensorParallelGPT`, the module-02 GPT split over the ranks;
- `cost`: communication per layer and per token, and sizing a 3D-parallel layout;
- `dtensor`: the same blocks parallelised by `torch.distributed.tensor.parallel`, the oracle
  (real torch.distributed ranks only).
"""

from .blocks import ParallelAttention, ParallelBlock, ParallelMLP
from .functions import (CopyToRanks, GatherFromRanks, LinearOverlapped, ReduceFromRanks,
                        copy_to_ranks, gather_from_ranks, linear_overlapped, reduce_from_ranks)
from .gpt import TensorParallelGPT
from .layers import ColumnParallelLinear, RowParallelLinear, shard, unshard
from .vocab import (VocabParallelCrossEntropy, VocabParallelEmbedding, vocab_parallel_cross_entropy,
                    vocab_range)

__all__ = [
    "ColumnParallelLinear", "CopyToRanks", "GatherFromRanks", "LinearOverlapped",
    "ParallelAttention", "ParallelBlock", "ParallelMLP", "ReduceFromRanks", "RowParallelLinear",
    "TensorParallelGPT", "VocabParallelCrossEntropy", "VocabParallelEmbedding", "copy_to_ranks",
    "gather_from_ranks", "linear_overlapped", "reduce_from_ranks", "shard", "unshard",
    "vocab_parallel_cross_entropy", "vocab_range",
]
