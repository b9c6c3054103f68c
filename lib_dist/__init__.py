"""lib_dist: the library behind the course on training large models across many devices.

Students program against `lib_dist.comm.Communicator`; `lib_dist.cluster.Cluster` hosts
one rank of a torch.distributed group on each ipyparallel engine.
"""

__version__ = "0.1.0"
