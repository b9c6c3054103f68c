"""Bytes and tensors of different shapes over a communicator whose collectives want equal ones.

`Communicator.all_gather` and `broadcast` move tensors of the same shape and dtype on every
rank. Horovod's allgather lets the first dimension differ, and its object operations move
pickles of any length; both come down to the same two steps here: first agree on the sizes
(a small all-gather), then pad everything to the largest and move it in one collective.
"""

from __future__ import annotations

import torch

from ..comm import Communicator

MAX_DIMS = 16
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
           torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def all_gather_bytes(comm: Communicator, data: bytes) -> list[bytes]:
    """Every rank's `data`, by rank."""
    sizes = _sizes(comm, [len(data)])
    longest = max(s[0] for s in sizes)
    buffer = torch.zeros(max(longest, 1), dtype=torch.uint8, device=comm.device)
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    parts = comm.all_gather(buffer)
    return [part[: s[0]].cpu().numpy().tobytes() for part, s in zip(parts, sizes)]


def broadcast_bytes(comm: Communicator, data: bytes | None, root: int) -> bytes:
    """`data` of rank `root`, on every rank (`data` is ignored elsewhere)."""
    length = torch.tensor([len(data) if comm.rank == root and data else 0],
                          dtype=torch.int64, device=comm.device)
    comm.broadcast(length, root)
    n = int(length.item())
    buffer = torch.zeros(max(n, 1), dtype=torch.uint8, device=comm.device)
    if comm.rank == root and data:
        buffer[:n] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    comm.broadcast(buffer, root)
    return buffer[:n].cpu().numpy().tobytes()


def all_gather_rows(comm: Communicator, tensor: torch.Tensor, what: str) -> torch.Tensor:
    """Every rank's `tensor` concatenated along the first dimension, in rank order. The first
    dimension may differ between ranks; the dtype and the other dimensions may not (a
    ValueError on every rank names the ranks that differ). A 0-d tensor counts as one row."""
    rows = tensor.reshape(1) if tensor.dim() == 0 else tensor
    if rows.dim() > MAX_DIMS:
        raise ValueError(f"{what}: tensors of more than {MAX_DIMS} dimensions are not supported")
    header = [_dtype_code(rows.dtype), rows.dim(), *rows.shape]
    headers = _sizes(comm, header + [-1] * (MAX_DIMS + 2 - len(header)))
    mine = headers[comm.rank]
    differ = [r for r, h in enumerate(headers)
              if h[0] != mine[0] or h[1] != mine[1] or h[3:] != mine[3:]]
    if differ:
        described = "; ".join(f"rank {r}: {_describe(h)}" for r, h in enumerate(headers))
        raise ValueError(f"{what}: every rank must give the same dtype and the same dimensions "
                         f"after the first ({described})")
    counts = [h[2] for h in headers]
    longest = max(counts)
    padded = torch.zeros((max(longest, 1), *rows.shape[1:]), dtype=rows.dtype,
                         device=comm.device)
    padded[: rows.shape[0]] = rows
    wide = padded.to(torch.int32) if padded.dtype == torch.int16 else padded
    parts = comm.all_gather(wide)
    return torch.cat([p[:n] for p, n in zip(parts, counts)]).to(rows.dtype).to(tensor.device)


def gather_rows(comm: Communicator, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Every rank's `rows` concatenated in rank order, where `counts` (every rank's number of
    rows, already agreed) and the other dimensions are known: one all-gather, padded."""
    if comm.world_size == 1:
        return rows.clone()
    padded = torch.zeros((max(max(counts), 1), *rows.shape[1:]), dtype=rows.dtype,
                         device=comm.device)
    padded[: rows.shape[0]] = rows
    wide = padded.to(torch.int32) if padded.dtype == torch.int16 else padded
    parts = comm.all_gather(wide)
    return torch.cat([p[:n] for p, n in zip(parts, counts)]).to(rows.dtype).to(rows.device)


def _sizes(comm: Communicator, values: list[int]) -> list[list[int]]:
    """Every rank's list of ints (all of one length), by rank."""
    mine = torch.tensor(values, dtype=torch.int64, device=comm.device)
    return [t.tolist() for t in comm.all_gather(mine)]


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _describe(header: list[int]) -> str:
    code, ndim = header[0], header[1]
    dtype = _DTYPES[code] if code < len(_DTYPES) else "another dtype"
    return f"{dtype} {tuple(header[2:2 + ndim])}"
