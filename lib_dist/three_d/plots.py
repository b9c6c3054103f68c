"""What each group of a (dp, pp, tp) mesh did, as events in world ranks, and a timeline of them.

Every group has its own trace, in which ranks are numbered within the group. `group_events`
puts one rank's events of every group back into world ranks, with the world ranks each event
involved (a collective: the whole group; a message: the two ends), so that a cell can check
that every collective stayed inside its group; `plot_groups` draws them on the virtual clock,
one row per rank, one colour per group.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..comm.base import Communicator
from ..comm.mesh import Mesh
from ..comm.trace import P2P_KINDS

COLORS = {"dp": "tab:red", "pp": "tab:green", "tp": "tab:orange", "compute": "tab:blue"}


class GroupEvent(NamedTuple):
    """One event of one rank: the group it ran in, its kind, its virtual span, the world
    ranks it involved."""

    rank: int
    group: str
    kind: str
    start: float
    end: float
    ranks: tuple[int, ...]


def members(group: Communicator) -> list[int]:
    """The world ranks of `group`, in group order (a simulated group's or a torch group's)."""
    found = getattr(group, "members", None) or getattr(group, "ranks", None)
    if found is None:
        raise TypeError(f"{type(group).__name__} does not say which world ranks it holds")
    return list(found)


def group_events(mesh: Mesh) -> list[GroupEvent]:
    """This rank's events in each of the mesh's groups, in world ranks (compute events, which
    a pipeline stage declares in its pp group, under "compute")."""
    out = []
    for name in mesh.names:
        group = mesh[name]
        world = members(group)
        for e in group.trace.of_rank(group.rank):
            involved = ((mesh.comm.rank, world[e.peer]) if e.kind in P2P_KINDS
                        else (mesh.comm.rank,) if e.kind == "compute" else tuple(world))
            out.append(GroupEvent(mesh.comm.rank, "compute" if e.kind == "compute" else name,
                                  e.kind, e.vstart or 0.0, e.vend or 0.0, involved))
    return out


def plot_groups(events: list[GroupEvent], ax: Any = None, title: str = "") -> Any:
    """Every rank's events on the virtual clock, one row per rank, coloured by group: compute
    above the line, each group's collectives and messages below it (messages pale: most of
    a send's or receive's span is waiting for its other end)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted({e.rank for e in events})
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.8 + 0.5 * len(ranks)))
    for e in events:
        if e.end <= e.start or e.kind == "barrier":
            continue
        row = len(ranks) - 1 - ranks.index(e.rank)
        above = e.group == "compute"
        ax.broken_barh([(e.start, e.end - e.start)], (row + (0.0 if above else -0.4), 0.38),
                       facecolors=COLORS[e.group], alpha=0.3 if e.kind in P2P_KINDS else 1.0,
                       edgecolor="black", linewidth=0.3)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in reversed(ranks)])
    ax.set_xlabel("virtual time")
    handles = [Patch(color=c, label=n if n == "compute" else f"in its {n} group")
               for n, c in COLORS.items()]
    handles.append(Patch(color="0.85", label="pale: a send or receive"))
    ax.legend(handles=handles, loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


__all__ = ["GroupEvent", "group_events", "members", "plot_groups"]
