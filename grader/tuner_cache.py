"""The all-reduce tuner's calibration, measured once per machine outside the sandbox and
shown to every submission read-only.

A group's first all-reduce calibrates lib_dist's tuner (`lib_dist.comm.fast.calibration`),
about a second for 4 ranks on a laptop: in every submission, since each starts its own
cluster. `prepare` measures it before grading instead, outside the sandbox, on a cluster of
each size the labs start, unless the machine's cache already holds it; the sandbox mounts the
cache read-only (`grader.sandbox`), so a submission can read it but never change what the
next one reads.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat

from lib_dist.comm.fast.calibration import cache_dir, calibrated_here

CLUSTER = re.compile(r"\bCluster\(\s*(\d+)")
SECONDS = 180  # for one calibration run: a cluster's start, a calibration, its stop


def cluster_sizes(notebooks: list[Path]) -> set[int]:
    """The rank counts of the clusters the notebooks' code starts (`Cluster(4, ...)`)."""
    sizes = set()
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                sizes |= {int(n) for n in CLUSTER.findall(cell.source)}
    return {n for n in sizes if n > 1}


def prepare(notebooks: list[Path]) -> Path | None:
    """Calibrate, where the cache lacks it, for every cluster size of `notebooks`; return the
    cache directory (None when the cache is off). A failed run only means the submissions
    calibrate for themselves, as they would without a cache."""
    directory = cache_dir()
    if directory is None:
        return None
    for n in sorted(n for n in cluster_sizes(notebooks) if not calibrated_here(n)):
        try:
            subprocess.run([sys.executable, "-m", "grader.tuner_cache", str(n)],
                           capture_output=True, timeout=SECONDS)
        except subprocess.TimeoutExpired:
            pass
    return directory


def main() -> None:
    """Start a cluster of argv[1] ranks and run one all-reduce: it loads the calibration
    from the cache, or measures and saves it."""
    import torch

    from lib_dist.cluster import Cluster

    with Cluster(int(sys.argv[1]), timeout=60) as cluster:
        cluster.run(lambda comm: comm.all_reduce(torch.zeros(1)))


if __name__ == "__main__":
    main()
