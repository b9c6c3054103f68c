"""Where to train: the first CUDA GPU when there is one, else the CPU; and what this machine is."""

from __future__ import annotations

import os
import platform

import torch


def pick_device(prefer: str | None = None) -> torch.device:
    """`torch.device("cuda")` if CUDA is available, else `torch.device("cpu")`.

    `prefer` ("cpu", "cuda", "cuda:1", ...) overrides the choice; asking for CUDA on a machine
    without it raises, rather than silently training somewhere else.
    """
    if prefer is not None:
        device = torch.device(prefer)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {prefer!r} requested, but CUDA is not available")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_machine() -> str:
    """One line naming the processor, cores and torch's CPU kernel path of this run.

    Stored notebooks print it beside any figure that depends on the machine (timings, bf16 on a
    CPU, which variant is faster), so a reader knows where the number was measured.
    """
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo
                     if line.startswith(("model name", "Model"))]
        model = names[0] if names else model
    except OSError:
        pass  # not Linux: platform's answer stands
    capability = torch.backends.cpu.get_cpu_capability()
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{model} ({platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
            f"CPU kernels: {capability}{gpu})")
