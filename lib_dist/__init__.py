"""lib_dist: the library behind the course on training large models across many devices.

Students program against `lib_dist.comm.Communicator`; `lib_dist.cluster.Cluster` hosts
one rank of a torch.distributed group on each ipyparallel engine. Single-device training lives
in `losses`, `models`, `data`, `optim` and `train`; `lib_dist.extend` lists every extension
point and loads a student's definitions from their notebooks.
"""

__version__ = "0.1.0"
