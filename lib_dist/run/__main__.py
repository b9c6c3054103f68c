"""`python -m lib_dist.run -np 4 train.py ARGS`: see `lib_dist.run`."""

import sys

from . import main

sys.exit(main())
