"""What tensor parallelism costs in communication, and how a 3D-parallel layout is sized.

Per transformer block, Megatron-style tensor parallelism all-reduces the residual stream
(tokens x n_embd activations) twice forward (after attention, after the MLP) and twice
backward (the inputs' gradients of both). A ring over tp ranks sends 2(tp-1)/tp of the
all-reduced bytes from every rank (`lib_dist.comm.algorithms.RING`). These all-reduces sit on
the critical path: the next layer needs their result, so nothing hides them, unlike data
parallel's gradient all-reduce (overlapped with backward) or a pipeline's one activation per
stage boundary. That is why tensor parallelism stays inside a node, on its fastest links.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..comm import AlphaBeta
from ..comm.algorithms import RING
from ..models.gpt import GPTConfig

ALL_REDUCES_PER_BLOCK = {"forward": 2, "backward": 2}


def block_bytes_per_token(n_embd: int, tp: int, bytes_per_element: int = 2) -> float:
    """Bytes one rank sends per token and transformer block, forward and backward."""
    per_all_reduce = RING.sent(tp, n_embd * bytes_per_element) if tp > 1 else 0.0
    return sum(ALL_REDUCES_PER_BLOCK.values()) * per_all_reduce


def block_communication_time(tokens: int, n_embd: int, tp: int, network: AlphaBeta,
                             bytes_per_element: int = 2) -> float:
    """Seconds of one block's four ring all-reduces of `tokens` x `n_embd` activations."""
    nbytes = tokens * n_embd * bytes_per_element
    return sum(ALL_REDUCES_PER_BLOCK.values()) * RING.cost(tp, nbytes, network)


@dataclass(frozen=True)
class Layout:
    """tp x pp x dp ranks, and the parameters and training-state bytes of the fullest rank
    (the first pipeline stage, which also holds the embeddings; the vocabulary is padded to
    a multiple of tp)."""

    tp: int
    pp: int
    dp: int
    params_per_rank: int
    bytes_per_rank: int


def block_params(config: GPTConfig) -> tuple[int, int]:
    """(parameters split by tensor parallelism, parameters every tp rank keeps whole) of one
    block: the four matrices and their output biases are split, LayerNorms and the two
    row-parallel biases are not."""
    c = config.n_embd
    split = (3 * c * c + 3 * c) + c * c + (4 * c * c + 4 * c) + 4 * c * c
    whole = 2 * (2 * c) + 2 * c
    return split, whole


def layout(config: GPTConfig, tp: int, pp: int, dp: int, bytes_per_param: int = 16) -> Layout:
    """The fullest rank of a tp x pp x dp layout of `config`, with `bytes_per_param` bytes of
    weights, gradients and optimizer state per parameter (16: mixed-precision Adam)."""
    if min(tp, pp, dp) < 1:
        raise ValueError(f"tp, pp and dp must be at least 1, got {tp}, {pp}, {dp}")
    if config.n_head % tp:
        raise ValueError(f"tp={tp} must divide n_head ({config.n_head})")
    if pp > config.n_layer:
        raise ValueError(f"pp={pp} stages for {config.n_layer} layers")
    split, whole = block_params(config)
    blocks = -(-config.n_layer // pp)  # the first stage's share, rounded up
    vocab = -(-config.vocab_size // tp) * tp  # padded to a multiple of tp, as Megatron does
    embeddings = vocab * config.n_embd // tp + config.block_size * config.n_embd
    final_norm = 2 * config.n_embd if pp == 1 else 0  # on the last stage otherwise
    params = blocks * (split // tp + whole) + embeddings + final_norm
    return Layout(tp, pp, dp, params, params * bytes_per_param)


def layouts(config: GPTConfig, ranks: int, max_tp: int = 8,
            bytes_per_param: int = 16) -> list[Layout]:
    """Every tp x pp x dp = `ranks` layout with tp at most `max_tp` (the GPUs of one node)
    that divides the heads, pp at most the layers; the fewest bytes per rank first."""
    out = []
    for tp in range(1, min(max_tp, ranks) + 1):
        for pp in range(1, min(config.n_layer, ranks // tp) + 1):
            if ranks % (tp * pp) == 0 and config.n_head % tp == 0:
                out.append(layout(config, tp, pp, ranks // (tp * pp), bytes_per_param))
    return sorted(out, key=lambda x: (x.bytes_per_rank, x.tp))
