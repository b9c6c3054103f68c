"""Mixtures of experts and expert parallelism (module 10).

- `routing`: the `Router` (linear gate, softmax, top-k, gates not renormalised), capacity
  and the drop order (token order), the Switch Transformer's load-balancing loss;
- `moe`: `MoE`, the layer in one process (experts: module 2's `FeedForward` or any factory),
  the building block and the oracle;
- `exchange`: `dispatch` and `combine`, the all-to-alls of rows as autograd functions whose
  backward is the reverse all-to-all;
- `parallel`: `ExpertParallelMoE`, each rank holding E/N experts of one `MoE`, its tokens
  counted (one all-gather), dispatched and combined (two all-to-alls each way);
- `load`: the bytes of each all-to-all and each rank's expert load, read from the trace.
"""

from .exchange import combine, dispatch, exchange_rows
from .load import all_to_all_bytes, expert_load, imbalance
from .moe import MoE, combine_rows, feed_forward
from .parallel import ExpertParallelMoE
from .routing import (Router, Routing, assignments, balance_loss, capacity, keep_in_order,
                      kept_counts, load_balancing_loss)

__all__ = [
    "ExpertParallelMoE", "MoE", "Router", "Routing", "all_to_all_bytes",
    "assignments", "balance_loss", "capacity", "combine", "combine_rows", "dispatch",
    "exchange_rows", "expert_load", "feed_forward", "imbalance", "keep_in_order", "kept_counts",
    "load_balancing_loss",
]
