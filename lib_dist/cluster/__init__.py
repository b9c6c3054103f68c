"""Ranks of a torch.distributed group hosted on ipyparallel engines. See `cluster.Cluster`."""

from ..errors import RankFailure, RankTimeout
from .cluster import Cluster

__all__ = ["Cluster", "RankFailure", "RankTimeout"]
