"""`python -m lib_dist.run -np 4 train.py ARGS`: run a script on 4 ranks, as horovodrun does
(`-m module ARGS` runs a module instead, as `python -m`: `-np 2 -m pytest test_x.py`).

The launcher starts a `lib_dist.cluster.Cluster` of N ranks (local processes by default;
ipyparallel's MPI, Slurm or SSH launchers with `--engines`), runs the script on every rank as
`__main__` (`lib_dist.run.script`), where `import lib_dist.horovod as hvd; hvd.init()` finds
its rank, and prints each rank's output as it comes, every line prefixed with the rank
(`[1] epoch 3 loss 0.41`; stderr lines go to stderr). It exits with 0 when every rank's script
finished (or called `sys.exit(0)`); otherwise with 1, naming the ranks that failed with their
tracebacks, or, past `--timeout`, the ranks that had not finished and what each was waiting
in. The launcher's environment reaches every rank (`HOROVOD_TIMELINE`, ...), with what
horovodrun adds (`HOROVOD_RANK`, `HOROVOD_SIZE`, `HOROVOD_LOCAL_RANK`, ...: see
`script.horovod_environment`).
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
        epilog="example: python -m lib_dist.run -np 4 examples/horovod_digits.py --epochs 3; "
               "a module: python -m lib_dist.run -np 2 -m pytest test_x.py")
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
    p.add_argument("-m", dest="module", default=None, metavar="MODULE",
                   help="run a module as `python -m MODULE` does; what follows it is its "
                        "arguments")
    p.add_argument("script", nargs="?", help="the Python script (horovodrun's `python "
                                             "script.py` also works)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the launcher with `argv` (default: the command line); returns the exit status."""
    argv, module, module_args = _split_module(list(sys.argv[1:] if argv is None else argv))
    args = parser().parse_args(argv)
    if module is None and args.script and _PYTHON.fullmatch(os.path.basename(args.script)) \
            and args.args:
        args.script, args.args = args.args[0], args.args[1:]
        if args.script == "-m" and args.args:  # horovodrun's `python -m module args`
            module, module_args = args.args[0], args.args[1:]
    if module is not None:
        if args.script:
            print("lib_dist.run: error: give a script or -m MODULE, not both", file=sys.stderr)
            return 2
        target, target_args = module, module_args
    elif args.script is None:
        print("lib_dist.run: error: give a script to run (or -m MODULE)", file=sys.stderr)
        return 2
    elif not Path(args.script).is_file():
        print(f"lib_dist.run: error: no such script: {args.script}", file=sys.stderr)
        return 2
    else:
        target, target_args = str(Path(args.script).resolve()), list(args.args)
    if args.np < 1:
        print(f"lib_dist.run: error: -np must be at least 1, got {args.np}", file=sys.stderr)
        return 2
    options = {"engines": args.engines} if args.engines else None
    printer = _Printer()
    try:
        with Cluster(args.np, device=args.device, timeout=args.op_timeout,
                     ipp_options=options) as cluster:
            try:
                run_streaming(cluster, run_script, target, target_args, os.getcwd(),
                              module is not None, on_output=printer.write,
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


_VALUED = {"-np", "--num-proc", "--device", "--engines", "--timeout", "--op-timeout"}


def _split_module(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """The launcher's own arguments, and the module and its arguments where a `-m MODULE`
    comes before the script: everything after the module name is the module's."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "-m" and i + 1 < len(argv):
            return argv[:i], argv[i + 1], argv[i + 2:]
        i += 2 if argv[i] in _VALUED else 1
    return argv, None, []


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
