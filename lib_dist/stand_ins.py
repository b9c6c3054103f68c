"""What the student edition of lib_dist runs where a lab's answer would be (`grader.edition`).

The student edition has no body for anything a lab asks students to write. Most of those only
the lab itself, or a later lab's own answers, call. A few, every lab calls: the losses of lab01
(a later lab's tests train with `next_token_loss`) and the collectives of lab03 (lab00, the
first lab, all-reduces). For those the student edition calls a stand-in instead of raising,
one that is not the lab's answer:

- the losses: torch's own (`F.cross_entropy`...), which lab01's tests fail an answer for
  running, by any name (they watch torch's dispatcher while the answer runs);
- the collectives: `lib_dist.comm.stand_ins`, on simulated ranks by Bruck's rounds (not lab03's
  direct sends or ring), on engines torch.distributed's own (`KEPT`: those bodies are one call
  of it each, kept as they are); lab03's graded run refuses an answer that calls them (they
  are its oracles, `lib_dist.labs`).

Until a student registers their own answers (`lib_dist.registry.use_my_answers`), these are
what lib_dist runs in their kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# reference ("module:qualname", as lib_dist.labs.LABS names it) -> its stand-in, "module:name"
STAND_INS = {
    "lib_dist.losses:log_softmax": "lib_dist.stand_ins:log_softmax",
    "lib_dist.losses:cross_entropy": "lib_dist.stand_ins:cross_entropy",
    "lib_dist.losses:binary_cross_entropy_with_logits":
        "lib_dist.stand_ins:binary_cross_entropy_with_logits",
    "lib_dist.comm:Communicator.broadcast": "lib_dist.comm.stand_ins:broadcast",
    "lib_dist.comm:Communicator.all_gather": "lib_dist.comm.stand_ins:all_gather",
    "lib_dist.comm:Communicator.reduce_scatter": "lib_dist.comm.stand_ins:reduce_scatter",
    "lib_dist.comm:Communicator._default_all_reduce": "lib_dist.comm.stand_ins:all_reduce",
    "lib_dist.comm:TorchCommunicator._default_all_reduce":
        "lib_dist.comm.stand_ins:native_all_reduce",
}
# references the student edition keeps as they are: a call of torch.distributed's own each
KEPT = ("lib_dist.comm:TorchCommunicator.broadcast", "lib_dist.comm:TorchCommunicator.all_gather",
        "lib_dist.comm:TorchCommunicator.reduce_scatter")


def log_softmax(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return F.log_softmax(logits, dim=dim)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean",
                  ignore_index: int = -100) -> torch.Tensor:
    return F.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)


def binary_cross_entropy_with_logits(logit: torch.Tensor, target: torch.Tensor,
                                     reduction: str = "mean") -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logit, target, reduction=reduction)
