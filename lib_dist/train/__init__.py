"""Single-device training: the loop, one step, checkpoints, the device, the memory budget."""

from .checkpoint import load_checkpoint, save_checkpoint
from .device import describe_machine, pick_device
from .loop import History, accuracy, evaluate, train
from .memory import (MemoryBudget, PeakMemory, format_budgets, gpt_activation_bytes,
                     gpt_memory_estimate, gpt_num_params, measure_peak_memory,
                     measure_training_memory)
from .step import LossFn, StepFn, train_step

__all__ = ["History", "LossFn", "MemoryBudget", "PeakMemory", "StepFn", "accuracy", "describe_machine",
           "evaluate", "format_budgets", "gpt_activation_bytes", "gpt_memory_estimate", "gpt_num_params",
           "load_checkpoint", "measure_peak_memory", "measure_training_memory", "pick_device",
           "save_checkpoint", "train", "train_step"]
