"""nbgrader's own commands and the formgrader, on this course: the same settings as
`python -m grader`. nbgrader reads this file when this folder is on Jupyter's config path:

    export JUPYTER_CONFIG_PATH=$PWD/grader      # from the repository's root
    nbgrader db student list
    jupyter lab                                 # the Formgrader tab grades by hand

The gradebook is instructor/gradebook.db unless LIB_DIST_GRADEBOOK names another SQLAlchemy URL.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.course import Course, put_own_scripts_on_path  # noqa: E402

c = get_config()  # type: ignore[name-defined]  # noqa: F821 - traitlets provides it
c.merge(Course().config())
put_own_scripts_on_path()
