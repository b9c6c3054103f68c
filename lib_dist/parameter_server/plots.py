"""Figures of module 08. Each function draws on the matplotlib Axes it is given (a new
figure's if none) and returns it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..comm import AlphaBeta
from .cost import ps_step_time, ring_step_time
from .experiments import CompressedRun


def _axes(ax: Any, size: tuple[float, float] = (6.5, 3.6)) -> Any:
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=size)
    return ax


def plot_step_cost(model_bytes: float, workers: Sequence[int], servers: Sequence[int],
                   network: AlphaBeta, ax: Any = None) -> Any:
    """Modelled communication time of one synchronous step against the number of workers:
    a parameter server with each number of shards, and the ring all-reduce."""
    ax = _axes(ax)
    for s in servers:
        ax.plot(workers, [1e3 * ps_step_time(model_bytes, w, s, network) for w in workers],
                marker="o", label=f"parameter server, {s} shard{'s' * (s > 1)}")
    ax.plot(workers, [1e3 * ring_step_time(model_bytes, w, network) for w in workers],
            marker="s", color="black", label="ring all-reduce")
    ax.set(xlabel="workers", ylabel="communication per step (ms)", xscale="log", yscale="log",
           title=f"{model_bytes / 2**20:.0f} MiB of gradients, "
                 f"{network.beta * 8 / 1e9:.0f} Gbit/s links")
    ax.set_xticks(list(workers), [str(w) for w in workers])
    ax.legend()
    return ax


def plot_curves(curves: Mapping[str, Sequence[tuple[float, float]]], xlabel: str, ylabel: str,
                title: str = "", ax: Any = None, logy: bool = False) -> Any:
    """One line per named curve of (x, y) points."""
    ax = _axes(ax)
    for name, points in curves.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=name)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logy:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    return ax


def plot_gossip(errors: Mapping[int, Sequence[float]], rates: Mapping[int, float],
                ax: Any = None) -> Any:
    """Consensus error against gossip steps (log scale), each ring's measured error beside
    the line |lambda_2|^t the eigenvalue predicts."""
    ax = _axes(ax)
    for i, (n, errs) in enumerate(errors.items()):
        steps = range(len(errs))
        ax.plot(steps, errs, color=f"C{i}", label=f"ring of {n}: measured")
        ax.plot(steps, [errs[-1] * rates[n] ** (t - len(errs) + 1) for t in steps], ":",
                color=f"C{i}", label=f"|lambda_2|^t = {rates[n]:.3f}^t")
    ax.set(xlabel="gossip steps", ylabel="||x - mean||", yscale="log",
           title="gossip on a ring: consensus error")
    ax.legend(fontsize=8)
    return ax


def plot_compression(runs: Sequence[CompressedRun], dense_bytes: float, ax: Any = None) -> Any:
    """Test loss against bytes a rank sends per step, top-k with and without error feedback,
    and the ring all-reduce of the dense gradient for reference."""
    ax = _axes(ax)
    for feedback, marker in ((True, "o"), (False, "x")):
        chosen = [r for r in runs if r.error_feedback == feedback or r.ratio == 1]
        ax.plot([r.bytes_per_step for r in chosen], [r.test_loss for r in chosen],
                marker=marker, label=f"top-k {'with' if feedback else 'without'} error feedback")
        for r in chosen:
            ax.annotate(f"{r.ratio:g}", (r.bytes_per_step, r.test_loss), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    ax.axvline(dense_bytes, color="gray", ls="--", label="dense ring all-reduce")
    ax.set(xscale="log", xlabel="bytes one rank sends per step (trace)", ylabel="test loss",
           title="top-k: loss against traffic (labels: share of entries sent)")
    ax.legend(fontsize=8)
    return ax
