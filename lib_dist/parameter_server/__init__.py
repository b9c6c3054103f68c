"""Before ring all-reduce (module 08): parameter servers, asynchronous SGD, model averaging,
gossip, and gradient compression.

- `layout`: servers are ranks 0 .. s-1, workers the rest; each server holds one shard of the
  flattened parameters;
- `serve` (`server`): a shard's server, synchronous or asynchronous (recording staleness);
  `work` and `parameter_server` (`worker`): the workers, and the job that runs both;
- `schedule`: deterministic asynchrony on a virtual clock (arrival order, staleness, bounded
  staleness, backup workers); `replay_async` (`replay`): asynchronous SGD in one process,
  the oracle of an asynchronous server, and `staleness_aware` learning rates;
- `averaging`: local SGD / FedAvg (`local_sgd`, `average_parameters`);
- `gossip`: averaging with ring neighbours, its rate from the mixing matrix, D-PSGD;
- `compression`: top-k with error feedback (`TopK`, `sparse_all_reduce`);
- `cost`: a synchronous step's communication, server against ring, modelled and traced.
"""

from .averaging import average_parameters, local_sgd, sum_of_deviations
from .compression import TopK, sparse_all_reduce
from .cost import (link_bytes, ps_link_bytes, ps_step_time, ring_link_bytes,
                   ring_step_time)
from .gossip import (dpsgd_step, gossip_step, ring_mixing_matrix, ring_neighbours,
                     ring_second_eigenvalue, second_eigenvalue)
from .layout import (flat_gradients, flat_parameters, load_flat, server_ranks, shard_bounds,
                     worker_ranks)
from .replay import AsyncRun, replay_async, staleness_aware
from .schedule import (Schedule, arrival_schedule, round_robin, staleness_of,
                       step_times_with_backups)
from .server import serve
from .worker import RankResult, gather_shards, parameter_server, pull, work

__all__ = [
    "AsyncRun", "RankResult", "Schedule", "TopK", "arrival_schedule", "average_parameters",
    "dpsgd_step", "flat_gradients", "flat_parameters", "gather_shards", "gossip_step",
    "link_bytes", "load_flat", "local_sgd", "parameter_server", "ps_link_bytes",
    "ps_step_time", "pull", "replay_async", "ring_link_bytes", "ring_mixing_matrix",
    "ring_neighbours", "ring_second_eigenvalue", "ring_step_time", "round_robin",
    "second_eigenvalue", "serve", "server_ranks", "shard_bounds", "sparse_all_reduce",
    "staleness_aware", "staleness_of", "step_times_with_backups", "sum_of_deviations",
    "work", "worker_ranks",
]
