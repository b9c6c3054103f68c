"""nbgrader's settings for every single-user server of the course hub (on JUPYTER_CONFIG_PATH).

The file-system exchange: one shared folder where the instructor's releases wait and the
students' submissions and feedback go (`LIB_DIST_EXCHANGE`, default /srv/nbgrader/exchange;
world-writable with the sticky bit, as nbgrader requires)."""

import os

c = get_config()  # noqa: F821 - Jupyter's config loader defines it

c.CourseDirectory.course_id = os.environ.get("LIB_DIST_COURSE_ID", "lib_dist")
c.Exchange.root = os.environ.get("LIB_DIST_EXCHANGE", "/srv/nbgrader/exchange")
