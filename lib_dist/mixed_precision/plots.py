"""Figures of module 07: gradients against fp16's range, training by precision, ZeRO's memory.

Each function draws on the matplotlib Axes it is given (a new figure's if none) and returns it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from .experiments import GradientMagnitudes, PrecisionRun, cast_fate
from .formats import FORMATS
from .memory import zero_bytes_per_rank


def _axes(ax: Any, size: tuple[float, float]) -> Any:
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=size)
    return ax


def plot_gradient_histogram(grads: GradientMagnitudes, ax: Any = None, title: str = "") -> Any:
    """Histograms of log2 |gradient| (parameters and activations, each as a share of its
    entries), with fp16's bands: flushed to zero, subnormal, normal, overflow."""
    ax = _axes(ax, (7.5, 3.6))
    fp16 = FORMATS["fp16"]
    bins = torch.arange(-50, 19, 1.0)
    for values, label, color in ((grads.parameters, "parameter gradients", "C0"),
                                 (grads.activations, "activation gradients", "C1")):
        logs = values.double().log2().clamp(-49.5, 17.5)
        counts = torch.histogram(logs.float(), bins=bins.float()).hist / values.numel()
        ax.stairs(counts.numpy(), bins.numpy(), label=label, color=color, fill=True, alpha=0.45)
    bands = [(-50, math.log2(fp16.smallest_subnormal) - 1, "flushed to zero", "tab:red"),
             (math.log2(fp16.smallest_subnormal) - 1, math.log2(fp16.finfo.tiny), "subnormal",
              "tab:orange"),
             (math.log2(fp16.finfo.max), 18, "overflow", "tab:purple")]
    for lo, hi, label, color in bands:
        ax.axvspan(lo, hi, color=color, alpha=0.1, lw=0)
        ax.text((lo + hi) / 2, 1.0, label, transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=8, color=color)
    ax.set(xlabel="log2 |gradient|", ylabel="share of entries", xlim=(-50, 18))
    ax.set_title(title, pad=16)
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_scale_window(grads: GradientMagnitudes, exponents: Sequence[int], ax: Any = None
                      ) -> Any:
    """The share of gradient entries lost in fp16 (flushed to zero, or overflowed to inf)
    when the loss, and with it every gradient, is multiplied by 2^k, against k."""
    ax = _axes(ax, (7.5, 3.4))
    for values, label, color in ((grads.parameters, "parameters", "C0"),
                                 (grads.activations, "activations", "C1")):
        fates = [cast_fate(values, 2.0**k) for k in exponents]
        ax.plot(exponents, [f["flushed to zero"] for f in fates], "o-", color=color,
                label=f"{label}: flushed to zero")
        ax.plot(exponents, [f["overflow"] for f in fates], "s--", color=color,
                label=f"{label}: overflow")
    ax.set_yscale("symlog", linthresh=1e-5)
    ax.set(ylim=(0, 1.5), xlabel="loss scale, log2", ylabel="share of gradient entries")
    ax.legend(fontsize=8)
    return ax


def plot_runs(runs: Sequence[PrecisionRun], axes: Any = None, window: int = 10,
              title: str = "") -> Any:
    """Left: each run's loss (mean of `window` steps; a cross where a run hit nan). Right:
    the loss scale of the runs that have one, with their skipped steps marked."""
    if axes is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(1, 2, figsize=(11, 3.6), width_ratios=(3, 2))
    left, right = axes
    for i, run in enumerate(runs):
        color = f"C{i}"
        finite = [v for v in run.losses if math.isfinite(v)]
        smooth = [sum(finite[max(0, s - window + 1):s + 1]) / min(s + 1, window)
                  for s in range(len(finite))]
        left.plot(range(len(smooth)), smooth, color=color, label=run.mode)
        if len(finite) < len(run.losses):
            left.plot(len(finite), finite[-1], "x", color=color, ms=10, mew=2)
        if run.scales:
            right.plot(range(len(run.scales)), run.scales, color=color, label=run.mode)
            right.plot(run.skipped, [run.scales[s] * 2 for s in run.skipped], "v", color=color)
    left.set(xlabel="step", ylabel=f"loss (mean of {window} steps)", title=title)
    left.legend(fontsize=8)
    right.set(xlabel="step", ylabel="loss scale", yscale="log", title="scale; ▼ skipped steps")
    if right.lines:
        right.legend(fontsize=8)
    return axes


def plot_zero_memory(params: int, worlds: Sequence[int], ax: Any = None, title: str = "",
                     limit_gib: float | None = None) -> Any:
    """GiB of parameters, gradients and optimizer state that one rank holds (mixed-precision
    Adam) under ZeRO stages 0 to 3, against the number of ranks."""
    ax = _axes(ax, (6.5, 3.6))
    names = ("0: plain data parallel", "1: optimizer state", "2: + gradients",
             "3: + parameters")
    for stage, name in enumerate(names):
        ax.plot(worlds, [zero_bytes_per_rank(stage, n).total * params / 2**30 for n in worlds],
                "o-", label=f"stage {name}")
    if limit_gib is not None:
        ax.axhline(limit_gib, color="grey", ls=":", label=f"{limit_gib:g} GiB")
    ax.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="GiB per rank", title=title)
    ax.set_xticks(list(worlds), [str(n) for n in worlds])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    return ax
