"""`python -m lib_dist.run -np 4 train.py ARGS`: run a script on 4 ranks, as horovodrun does.

The launcher starts a `lib_dist.cluster.Cluster` of N ranks (local processes by default;
ipyparallel's MPI, Slurm or SSH launchers with `--engines`), runs the script on every rank as
`__main__` (`lib_dist.run.script`), where `import lib_dist.horovod as hvd; hvd.init()` finds
its rank, and prints each rank's output as it comes, every line prefixed with the rank
(`[1] epoch 3 loss 0.41`; stderr lines go to stderr). It exits with 0 when every rank's script
finished (or called `sys.exit(0)`); otherwise with 1, naming the ranks that failed with their
tracebacks, or, past `--timeout`, the ranks that had not finished and what each was waiting
in. The launcher's environment reaches every rank (`HOROVOD_TIMELINE`, ...).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
from pathlib import Path
from typing import TextIO

from ..cluster import Cluster, RankFailure, RankTimeout
from ..cluster.streaming import run_streaming
from .script import run_script

NO_LIMIT = 1e7  # seconds: what "no --timeout" means (threading's timers need a number)
_PYTHON = re.compile(r"python[0-9.]*(\.exe)?")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lib_dist.run",
        description="Run a Python script on N ranks of a lib_dist cluster, as horovodrun "
                    "does: the script calls `import lib_dist.horovod as hvd; hvd.init()`. "
                    "Each rank's output is printed as it comes, prefixed with [rank].",
        epilog="example: python -m lib_dist.run -np 4 examples/horovod_digits.py --epochs 3")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, metavar="N",
                   help="number of ranks")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: GPU i for local rank i when every rank has one, else CPU "
                        "(default: auto)")
    p.add_argument("--engines", default=None, metavar="LAUNCHER",
                   help="ipyparallel's engine launcher: local, mpi, slurm, ssh, ... "
                        "(default: lib_dist's forked local processes)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop every rank and fail, naming those still running, if the "
                        "script has not finished after this long (default: no limit)")
    p.add_argument("--op-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long one collective, and the ranks' start-up, may wait "
                        "(default: 300)")
    p.add_argument("script", help="the Python script (horovodrun's `python script.py` "
                                  "also works)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the launcher with `argv` (default: the command line); returns the exit status."""
    args = parser().parse_args(argv)
    if _PYTHON.fullmatch(os.path.basename(args.script)) and args.args:
        args.script, args.args = args.args[0], args.args[1:]
    script = Path(args.script)
    if not script.is_file():
        print(f"lib_dist.run: error: no such script: {args.script}", file=sys.stderr)
        return 2
    if args.np < 1:
        print(f"lib_dist.run: error: -np must be at least 1, got {args.np}", file=sys.stderr)
        return 2
    options = {"engines": args.engines} if args.engines else None
    printer = _Printer()
    try:
        with Cluster(args.np, device=args.device, timeout=args.op_timeout,
                     ipp_options=options) as cluster:
            try:
                run_streaming(cluster, run_script, str(script.resolve()), list(args.args),
                              os.getcwd(), on_output=printer.write,
                              timeout=args.timeout or NO_LIMIT, restart=False)
            finally:
                printer.flush()
    except (RankFailure, RankTimeout) as e:
        print(f"lib_dist.run: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lib_dist.run: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except (RuntimeError, ValueError, OSError) as e:  # the cluster could not start
        print(f"lib_dist.run: could not start {args.np} ranks: {e}", file=sys.stderr)
        return 1
    return 0


class _Printer:
    """Prints each rank's output line by line, prefixed with `[rank] `."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], str] = {}
        self._lock = threading.Lock()

    def write(self, rank: int, stream: str, text: str) -> None:
        with self._lock:
            lines = (self._partial.pop((rank, stream), "") + text).split("\n")
            if lines[-1]:
                self._partial[(rank, stream)] = lines[-1]
            out = _out(stream)
            for line in lines[:-1]:
                out.write(f"[{rank}] {line}\n")
            out.flush()

    def flush(self) -> None:
        with self._lock:
            for (rank, stream), line in sorted(self._partial.items()):
                _out(stream).write(f"[{rank}] {line}\n")
            self._partial.clear()
            sys.stdout.flush()
            sys.stderr.flush()


def _out(stream: str) -> TextIO:
    return sys.stderr if stream == "stderr" else sys.stdout
