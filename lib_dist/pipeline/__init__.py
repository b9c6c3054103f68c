"""Pipeline parallelism: a model split by layers into stages, one per rank, and the schedules
that keep the stages busy.

- `schedules`: a schedule as data, per rank a list of `Step`s (`gpipe`, `one_f_one_b`,
  `naive`); `simulate` runs one on paper into a virtual timeline; `metrics` measures a
  timeline (makespan, bubble, live activations) and gives the formulas.
- `split`: `split_model(layers, p)`, balanced consecutive stages.
- `stage`: `Stage`, one rank's layers and the activations its backwards will need.
- `p2p`: activations forward and gradients backward, to neighbours only.
- `execute`: `run_schedule`, and `gpipe_step` / `one_f_one_b_step`, one training step.
- `gpt`: module 02's GPT as a list of layers.
- `torch_schedules`: `torch.distributed.pipelining`'s schedules as our `Step` lists.

Draw a timeline with `lib_dist.comm.plot_trace`, on either clock.
"""

from .execute import gpipe_step, micro_batches, one_f_one_b_step, run_schedule
from .gpt import Embed, Head, gpt_layers, next_token_loss
from .metrics import (bubble_fraction, busy_time, formula_bubble, formula_makespan,
                      live_activations, makespan, peak_live)
from .p2p import recv_backward, recv_forward, send_backward, send_forward
from .schedules import SCHEDULES, Schedule, Step, gpipe, naive, one_f_one_b
from .simulate import ScheduleDeadlock, simulate
from .split import balanced_bounds, parameter_count, split_model
from .stage import Stage, StepCosts
from .torch_schedules import torch_schedule

__all__ = [
    "SCHEDULES", "Embed", "Head", "Schedule", "ScheduleDeadlock", "Stage", "Step", "StepCosts",
    "balanced_bounds", "bubble_fraction", "busy_time", "formula_bubble", "formula_makespan",
    "gpipe", "gpipe_step", "gpt_layers", "live_activations", "makespan", "micro_batches",
    "naive", "next_token_loss", "one_f_one_b", "one_f_one_b_step", "parameter_count", "peak_live",
    "recv_backward", "recv_forward", "run_schedule", "send_backward", "send_forward", "simulate",
    "split_model", "torch_schedule",
]
