"""Point-to-point messages through shared memory, between ranks on one host.

gloo sends every message over a loopback TCP socket, even between processes on one machine:
each byte is copied into the kernel and out again, and a thread wakes per message. MPI and
NCCL move intra-node messages through shared memory instead, and so does
`TorchCommunicator` when every rank of its gloo group runs on one x86-64 Linux host (see
`join_group`'s `messages`): `SharedMemoryMessages` is that transport. The contract is the
communicator's (`lib_dist.comm.base`): a send completes once the receiver has taken the whole
message, so two ranks that both send first still deadlock, and messages between two ranks
arrive in the order they were sent.

Layout: a channel of slots per pair of ranks and lane, with counters of the pieces
published and taken (`channels`). A message goes in pieces of at most `SLOT` bytes: piece p
goes to slot p % SLOTS once `p - taken < SLOTS`, then `sent` becomes p + 1; the receiver
copies it out and sets `taken` to p + 1.

Progress: a thread per rank moves the pieces of every pending operation, as gloo's own
thread does, so that a rank blocked elsewhere (in a barrier, say) still delivers what it
posted. The posting thread moves what it can at once, and a thread in `wait()` moves bytes
itself for a while, so that no thread needs waking when its message completes; the
progress thread stands back until the rank's own threads have left the operations alone
for `SETTLE` (two threads of one process polling would fight over the GIL). A thread with
nothing to move yields its core first (ranks often share cores), then sleeps in growing naps
of up to a millisecond.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

import torch

from ..base import Handle
from ..errors import CommError, CommTimeout, MismatchError
from .channels import LANES, SLOT, SLOTS, Channels, dtype_code, dtype_name
from .files import SPIN, pause

SETTLE = 1e-3  # seconds the progress thread leaves operations to the rank's own threads
Queues = dict[tuple[int, int], deque["Message"]]  # (lane, peer) -> pending operations


class Message(Handle):
    """A posted send or receive; `wait()` returns once it completed, or raises CommError."""

    def __init__(self, kind: str, peer: int, lane: int, tensor: torch.Tensor, what: str,
                 transport: SharedMemoryMessages):
        self.kind, self.peer, self.lane, self.what = kind, peer, lane, what
        self.tensor = tensor
        # numpy copies on the calling thread: torch would start its thread pool for each
        # piece, and waking those threads costs more than copying a piece
        self.bytes = tensor.detach().reshape(-1).view(torch.uint8).numpy()
        self.total = self.bytes.size
        self.pieces = max(1, math.ceil(self.total / SLOT))
        self.moved = 0  # pieces published (send) or copied out (receive)
        self.last_piece: int | None = None  # a send's last piece, by channel count
        self.deadline = time.monotonic() + transport.timeout
        self.error: CommError | None = None
        self._done = threading.Event()
        self._transport = transport

    def wait(self) -> None:
        if not self._done.is_set():
            self._transport._drive_until(self)
        if not self._done.wait(self._transport.timeout + 5):  # the thread fails it first
            raise CommTimeout(f"{self.what} did not complete")
        if self.error is not None:
            raise self.error

    def is_completed(self) -> bool:
        if not self._done.is_set():
            self._transport._progress_now()
        return self._done.is_set()

    def finish(self, error: CommError | None = None) -> None:
        self.error = error
        self._done.set()


class SharedMemoryMessages:
    """One rank's end of the transport, over the group's mapped `files` (one per rank, of
    `Channels.file_bytes(world_size)` bytes; see `files.map_shared_files`)."""

    def __init__(self, rank: int, world_size: int, files: list[torch.Tensor], timeout: float):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._channels = Channels(world_size, files)
        self._sends: Queues = {(lane, peer): deque() for lane in range(LANES)
                               for peer in range(world_size)}
        self._recvs: Queues = {key: deque() for key in self._sends}
        self._published = dict.fromkeys(self._sends, 0)
        self._consumed = dict.fromkeys(self._sends, 0)
        self._waiters = 0  # threads inside wait(), moving bytes themselves
        self._touched = 0.0  # when a thread of the rank's own last posted or moved bytes
        self._broken: str | None = None
        self._closed = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._progress_forever, daemon=True,
                                        name=f"lib_dist shared-memory messages, rank {rank}")
        self._thread.start()

    def isend(self, tensor: torch.Tensor, dst: int, lane: int = 0) -> Message:
        """Start sending the contiguous `tensor` to rank `dst`."""
        return self._post(Message("send", dst, lane, tensor, f"rank {self.rank}: send to rank "
                                  f"{dst}", self), self._sends)

    def irecv(self, buffer: torch.Tensor, src: int, lane: int = 0) -> Message:
        """Start receiving rank `src`'s next message on `lane` into the contiguous `buffer`."""
        return self._post(Message("recv", src, lane, buffer, f"rank {self.rank}: recv from "
                                  f"rank {src}", self), self._recvs)

    def close(self) -> None:
        """Stop the progress thread; pending operations fail."""
        with self._cv:
            self._closed = True
            self._fail_all("the communicator was closed")
            self._cv.notify()

    # -- progress ------------------------------------------------------------------------

    def _post(self, message: Message, queues: Queues) -> Message:
        with self._cv:
            if self._broken or self._closed:
                message.finish(CommError(f"{message.what}: {self._broken or 'closed'}"))
                return message
            idle = not self._busy()
            queues[(message.lane, message.peer)].append(message)
            self._touched = time.monotonic()
            self._progress()
            if idle:  # the progress thread sleeps until there is work: wake it
                self._cv.notify()
        return message

    def _progress_now(self) -> None:
        with self._cv:
            self._progress()

    def _drive_until(self, message: Message) -> None:
        """Move bytes in the waiting thread itself until `message` completes or nothing has
        moved for `SPIN` seconds: no thread has to be woken when the message completes (the
        progress thread stands back meanwhile). Then leave it to the progress thread."""
        last_move = time.monotonic()
        with self._cv:
            self._waiters += 1
        try:
            while not message._done.is_set():
                with self._cv:
                    moved = self._progress()
                    now = self._touched = time.monotonic()
                if moved:
                    last_move = now
                elif now - last_move > SPIN:
                    return
                else:
                    pause(0.0)
        finally:
            with self._cv:
                self._waiters -= 1

    def _progress_forever(self) -> None:
        idle_since: float | None = None
        with self._cv:
            while not self._closed:
                if not self._busy():
                    self._cv.wait()
                    idle_since = None
                    continue
                quiet = time.monotonic() - self._touched
                if self._waiters or quiet < SETTLE:  # a thread of the rank's own is on it
                    self._cv.wait(SETTLE - quiet if quiet < SETTLE else SETTLE)
                    continue
                if self._progress():
                    idle_since = None
                    continue
                now = time.monotonic()
                self._expire(now)
                idle_since = idle_since or now
                self._cv.release()
                try:
                    pause(now - idle_since)
                finally:
                    self._cv.acquire()

    def _progress(self) -> bool:
        """Move every pending operation as far as it can go now; whether anything moved."""
        moved = False
        for key, queue in self._sends.items():
            if queue:
                moved |= self._push(key, queue)
        for key, queue in self._recvs.items():
            if queue:
                moved |= self._pull(key, queue)
        return moved

    def _busy(self) -> bool:
        return any(self._sends.values()) or any(self._recvs.values())

    def _push(self, key: tuple[int, int], queue: deque[Message]) -> bool:
        lane, peer = key
        taken = self._channels.taken(peer, lane, self.rank)
        moved = False
        while queue and queue[0].last_piece is not None and taken > queue[0].last_piece:
            queue.popleft().finish()
            moved = True
        for message in queue:
            while message.moved < message.pieces:
                if self._published[key] - taken >= SLOTS:
                    return moved
                self._write_piece(key, message)
                moved = True
        return moved

    def _write_piece(self, key: tuple[int, int], message: Message) -> None:
        lane, peer = key
        piece = self._published[key]
        header, data = self._channels.slot(self.rank, lane, peer, piece)
        lo = message.moved * SLOT
        hi = min(lo + SLOT, message.total)
        data[: hi - lo] = message.bytes[lo:hi]
        header[:4] = (message.total, hi - lo, dtype_code(message.tensor),
                      message.tensor.numel())
        message.moved += 1
        if message.moved == message.pieces:
            message.last_piece = piece
        self._published[key] = piece + 1
        self._channels.set_sent(self.rank, lane, peer, piece + 1)

    def _pull(self, key: tuple[int, int], queue: deque[Message]) -> bool:
        lane, peer = key
        sent = self._channels.sent(peer, lane, self.rank)
        moved = False
        while queue and self._consumed[key] < sent:
            message, piece = queue[0], self._consumed[key]
            header, data = self._channels.slot(peer, lane, self.rank, piece)
            total, nbytes, code, numel = (int(v) for v in header[:4])
            if message.moved == 0 and (total, code) != (message.total,
                                                        dtype_code(message.tensor)):
                queue.popleft()
                self._broken = "a message did not fit its receive buffer"
                message.finish(MismatchError(
                    f"{message.what}: the message holds {numel} elements of "
                    f"{dtype_name(code)} ({total} bytes) but the buffer has "
                    f"{message.tensor.numel()} of {message.tensor.dtype} ({message.total} "
                    f"bytes); shapes and dtypes of a send and its receive must match"))
                return True
            lo = message.moved * SLOT
            message.bytes[lo: lo + nbytes] = data[:nbytes]
            message.moved += 1
            self._consumed[key] = piece + 1
            self._channels.set_taken(self.rank, lane, peer, piece + 1)
            moved = True
            if message.moved == message.pieces:
                queue.popleft().finish()
        return moved

    def _expire(self, now: float) -> None:
        """Fail operations past their deadline: the channel is then out of step, and the
        group unusable, as a gloo group is after a timeout."""
        late = [m for queues in (self._sends, self._recvs) for q in queues.values() for m in q
                if m.deadline < now]
        if late:
            self._broken = "an earlier operation timed out; the group must be rebuilt"
            for m in late:
                queues = self._sends if m.kind == "send" else self._recvs
                queues[(m.lane, m.peer)].remove(m)
                m.finish(CommTimeout(f"{m.what} did not complete within {self.timeout:g} s; "
                                     f"the group is now unusable and must be rebuilt"))

    def _fail_all(self, reason: str) -> None:
        for queues in (self._sends, self._recvs):
            for queue in queues.values():
                while queue:
                    message = queue.popleft()
                    message.finish(CommError(f"{message.what}: {reason}"))
