"""What this install of lib_dist.horovod has, in Horovod's words (`hvd.gloo_built()`,
`hvd.nccl_built()`, ...): the backends torch.distributed has here, and False for what
lib_dist.horovod never uses (MPI, DDL, oneCCL) though Horovod may be built with it."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .basics import state


def gloo_built() -> bool:
    """Whether torch.distributed here has gloo (lib_dist's CPU backend)."""
    return dist.is_available() and dist.is_gloo_available()


def nccl_built() -> bool:
    """Whether torch.distributed here has NCCL (lib_dist's GPU backend)."""
    return dist.is_available() and dist.is_nccl_available()


def mpi_built() -> bool:
    """False: lib_dist.horovod never moves data over MPI (an MPI launcher may still start the
    ranks: `python -m lib_dist.run --engines mpi`)."""
    return False


def gloo_enabled() -> bool:
    """Whether this run's collectives go over gloo."""
    return getattr(state().comm, "backend", None) == "gloo"


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


def cuda_built() -> bool:
    """Whether this torch was built with CUDA."""
    return torch.backends.cuda.is_built()


def rocm_built() -> bool:
    return torch.version.hip is not None


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False
