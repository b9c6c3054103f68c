"""What Horovod's coordinator decides each cycle, from every rank's list of waiting requests:
which requests every rank has made (by name), whether the ranks agree on them, and what a rank
that has joined contributes. `queue` runs the cycles; this module is their arithmetic.

A request is (kind, name, signature, info): the signature must be equal on every rank (dtype,
shape, root rank, reduce op, scale factors: whatever the operation needs equal), the info is
the rank's own part (the rows it gathers, its splits), passed to everyone's `run`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..comm import Communicator
from . import wire

CAPACITY = 4096  # bytes of requests a rank sends in the cycle's one all-gather; more: a second


class HorovodInternalError(RuntimeError):
    """An operation the ranks could not agree on (Horovod's exception, a RuntimeError)."""


@dataclass
class Entry:
    """One request every rank has made (or has joined past), as the cycle decided it."""

    kind: str
    name: str
    signature: dict[str, Any]
    infos: list[Any]
    error: str | None = None
    last_joined: int = -1


# what a rank that has joined does in a request of this kind: take part with zeros
JOINABLE: dict[str, Callable[[Communicator, dict[str, Any]], None]] = {}


def exchange(comm: Communicator, mine: list[tuple[str, str, dict[str, Any], Any]]
             ) -> list[list[tuple[str, str, dict[str, Any], Any]]]:
    """Every rank's list of requests, by rank: one all-gather of `CAPACITY` bytes, and a
    second, of the exact sizes, when some rank's list is longer."""
    data = pickle.dumps(mine)
    buffer = torch.zeros(CAPACITY, dtype=torch.uint8, device=comm.device)
    header = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
    buffer[:8] = header.to(comm.device)
    if len(data) <= CAPACITY - 8:
        buffer[8: 8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    parts = [p.cpu() for p in comm.all_gather(buffer)]
    sizes = [int(p[:8].view(torch.int64).item()) for p in parts]
    if max(sizes) > CAPACITY - 8:
        blobs = wire.all_gather_bytes(comm, data)
    else:
        blobs = [p[8: 8 + n].numpy().tobytes() for p, n in zip(parts, sizes)]
    return [pickle.loads(b) for b in blobs]


def ready(everyone: list[list[tuple[str, str, dict[str, Any], Any]]],
          joined_at: dict[int, int], cycle: int) -> list[Entry]:
    """The requests every rank has made this cycle (a rank that has joined counts for the
    joinable kinds), in the order the lowest rank that has not joined made them, each with
    the error every rank raises if the ranks disagree on it. `joined_at`: the cycle each
    rank's join was first seen in (updated here: every rank sees the same cycles)."""
    size = len(everyone)
    by_rank = [{name: (kind, sig, info) for kind, name, sig, info in requests}
               for requests in everyone]
    joined = {r for r in range(size) if any(k == "JOIN" for k, *_ in everyone[r])}
    for r in joined:
        joined_at.setdefault(r, cycle)
    active = [r for r in range(size) if r not in joined]
    entries, refused = [], set()
    if joined:  # what cannot run with a rank that has joined fails at once, names unmatched
        for r in active:
            for kind, name, sig, _ in everyone[r]:
                if kind not in JOINABLE and kind != "JOIN" and name not in refused:
                    refused.add(name)
                    entries.append(Entry(kind, name, sig, [None] * size, _refusal(
                        kind, name, sorted(joined))))
    for kind, name, sig, _ in everyone[active[0] if active else 0]:
        if name in refused:
            continue
        if kind == "JOIN":
            if len(joined) == size:
                last = max(joined, key=lambda r: (joined_at[r], r))
                entries.append(Entry(kind, name, sig, [None] * size, last_joined=last))
            continue
        have = [r for r in range(size) if name in by_rank[r]]
        if any(r not in have and r not in joined for r in range(size)):
            continue  # some rank has not asked for it yet
        error = disagreement(kind, name, {r: by_rank[r][name] for r in have})
        infos = [by_rank[r][name][2] if r in have else None for r in range(size)]
        entries.append(Entry(kind, name, sig, infos, error))
    return entries


def _refusal(kind: str, name: str, joined: list[int]) -> str:
    many = len(joined) > 1
    return (f"{kind.lower()} {name!r}: rank{'s' if many else ''} {', '.join(map(str, joined))} "
            f"ha{'ve' if many else 's'} joined (hvd.join); only allreduce runs with ranks "
            f"that have joined")


def disagreement(kind: str, name: str,
                 requests: dict[int, tuple[str, dict[str, Any], Any]]) -> str | None:
    """What the ranks disagree on in request `name`, said in full; None if they agree."""
    kinds = {r: k for r, (k, _, _) in requests.items()}
    if len(set(kinds.values())) > 1:
        said = "; ".join(f"rank {r}: {k.lower()}" for r, k in kinds.items())
        return f"{name!r} names different operations on different ranks ({said})"
    fields = list(dict.fromkeys(f for _, sig, _ in requests.values() for f in sig))
    differ = [f for f in fields if len({repr(sig.get(f)) for _, sig, _ in requests.values()}) > 1]
    if not differ:
        return None
    said = "; ".join(f"rank {r}: " + ", ".join(f"{f} {_show(sig.get(f))}" for f in differ)
                     for r, (_, sig, _) in requests.items())
    return (f"{kind.lower()} {name!r}: the ranks disagree on the {' and the '.join(differ)} "
            f"({said})")


def take_part(comm: Communicator, entry: Entry) -> None:
    """A rank that has joined takes part in `entry` (an allreduce) with zeros."""
    JOINABLE[entry.kind](comm, entry.signature)


def signature(t: torch.Tensor, **more: Any) -> dict[str, Any]:
    """What every rank's tensor must agree on: dtype, shape, device type, and `more`."""
    return dict(dtype=str(t.dtype).replace("torch.", ""), shape=tuple(t.shape),
                device=t.device.type, **more)


def zeros(sig: dict[str, Any], device: torch.device) -> torch.Tensor:
    """A tensor of zeros as `signature` describes it."""
    return torch.zeros(sig["shape"], dtype=getattr(torch, sig["dtype"]), device=device)


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"({', '.join(map(str, value))}{',' if len(value) == 1 else ''})"
    return str(value)
