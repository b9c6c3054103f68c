"""What runs inside each ipyparallel engine: joining the group and calling user functions.

The client (`lib_dist.cluster.Cluster`) applies these functions on the engines; they live in
an importable module so that engines hold one copy of the rank's state, in `_rank` (private:
code on an engine reaches the rank's communicator through `communicator()`).
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

from lib_dist.cluster.outcome import Outcome, whereabouts_key
from lib_dist.comm import TorchCommunicator, Trace, join_group

_rank: dict[str, Any] = {}


def communicator() -> TorchCommunicator | None:
    """This engine's communicator (what `%%px` cells call `comm`), once it has joined the
    cluster's group; None before, and in a process that is not an engine."""
    comm: TorchCommunicator | None = _rank.get("comm")
    return comm


def describe() -> dict[str, Any]:
    """Where this engine runs: host, pid, and how many GPUs it sees."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def open_store(world_size: int, timeout: float) -> int:
    """On rank 0: host the rendezvous store on a free port chosen by the OS; return the port."""
    import datetime

    leave_group()
    store = dist.TCPStore("0.0.0.0", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    _rank["store"] = store
    return store.port


def join(rank: int, world_size: int, host: str, port: int, device: str, timeout: float) -> str:
    """Join the group as `rank` and publish `comm`, `rank`, `world_size`, `device` to %%px."""
    import datetime

    store = _rank.get("store") if rank == 0 else None
    if store is None:
        leave_group()
        store = dist.TCPStore(host, port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout))
    comm = join_group(rank, world_size, store, device, timeout)
    _rank.update(store=store, comm=comm)
    _publish(comm=comm, rank=rank, world_size=world_size, device=comm.device)
    return comm.backend


def call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
         call_id: int = 0, report_after: float | None = None) -> Outcome:
    """Run `fn(comm, *args, **kwargs)` on this rank: its result and trace, or the error (a
    plain traceback text from `fn` down, and the exception itself where it can be pickled).

    If the call is still running after `report_after` seconds, a timer thread leaves word in
    the group's store of what this rank is blocked in, for the client's timeout message
    (the main thread may be stuck inside gloo, where nothing else can ask it).
    """
    comm: TorchCommunicator = _rank["comm"]
    comm.trace = Trace()
    timer = None
    if report_after is not None:
        timer = threading.Timer(report_after, _report_whereabouts, (comm, call_id))
        timer.daemon = True
        timer.start()
    try:
        return Outcome(result=fn(comm, *args, **kwargs), events=comm.trace.events)
    except Exception as e:  # noqa: BLE001 - sent back whole, by rank
        return Outcome(error=_format(e), exception=_picklable(e))
    finally:
        if timer is not None:
            timer.cancel()


def _format(e: BaseException) -> str:
    """The traceback from the user's function down, without this module's frame."""
    here = e.__traceback__
    return "".join(traceback.format_exception(type(e), e, here.tb_next if here else None))


def _picklable(e: BaseException) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return None


def _report_whereabouts(comm: TorchCommunicator, call_id: int) -> None:
    where = (f"waiting in {comm.waiting_in}" if comm.waiting_in
             else "running Python code, not waiting on any message")
    _rank["store"].set(whereabouts_key(call_id, comm.rank), where)


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    _rank.clear()


def _publish(**names: Any) -> None:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.user_ns.update(names)
