"""The sandbox's first step, run as the kernel command: `python -m grader.jail [limits] --
bwrap ...`. It joins the sandbox's cgroups, sets the per-process limits and becomes
bubblewrap, so that every process of the sandbox inherits both.
"""

from __future__ import annotations

import argparse
import os
import resource
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--file-size-mb", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--cgroup", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    for group in args.cgroup:
        (Path(group) / "cgroup.procs").write_text(str(os.getpid()))
    resource.setrlimit(resource.RLIMIT_DATA, (args.memory_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_size_mb << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (args.processes,) * 2)  # where no cgroup counts
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
