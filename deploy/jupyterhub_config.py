"""JupyterHub for a lib_dist course: `jupyterhub -f deploy/jupyterhub_config.py` (as root).

Local unix users log in with their passwords (PAM); each gets a JupyterLab single-user server,
spawned as that user, from this kit's environment (the `.venv` that `make install` built, or
the conda environment of environment.yml), with nbgrader's lab extension: Assignments (fetch,
submit, feedback) for students, Formgrader for the instructor. nbgrader's file-system exchange
is a shared folder (`deploy/jupyter/nbgrader_config.py`). Autograding runs the instructor's
`python -m grader autograde`, in the grader's sandbox.

Settings from the environment (defaults for a class on this machine):
    LIB_DIST_HUB_PORT       the port the proxy listens on (8000), on LIB_DIST_HUB_IP (127.0.0.1)
    LIB_DIST_HUB_DATA       the hub's database, cookie secret and pid files (/srv/lib_dist/hub)
    LIB_DIST_STUDENTS       comma-separated unix users who may log in as students
    LIB_DIST_INSTRUCTOR     the instructor's unix user (an admin of the hub)
    LIB_DIST_PROXY          the configurable-http-proxy command (`make hub-tool` installs it)
    LIB_DIST_LABS           the released labs folder, where `python -m grader release` built the
                            editions of lib_dist students import (this kit's labs/)

What a real deployment changes: an authenticator for the university's accounts (LTI from the
learning platform with `ltiauthenticator`, or OAuth with `oauthenticator`) instead of PAM, and
a spawner that isolates users and limits their CPU and memory (`systemdspawner`, or
`kubespawner` on Kubernetes with the image built from environment.yml), with the exchange on a
volume every server mounts. Nothing else here changes.
"""

import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 - JupyterHub's config loader defines it

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from start import DEFAULT_PROXY  # noqa: E402 - where `make hub-tool` puts the proxy
DATA = Path(os.environ.get("LIB_DIST_HUB_DATA", "/srv/lib_dist/hub"))
STUDENTS = {u for u in os.environ.get("LIB_DIST_STUDENTS", "").split(",") if u}
INSTRUCTOR = os.environ.get("LIB_DIST_INSTRUCTOR", "instructor")

c.JupyterHub.ip = os.environ.get("LIB_DIST_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("LIB_DIST_HUB_PORT", "8000"))
c.JupyterHub.hub_port = int(os.environ.get("LIB_DIST_HUB_API_PORT", "8081"))
c.JupyterHub.db_url = f"sqlite:///{DATA / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(DATA / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(DATA / "jupyterhub.pid")
c.ConfigurableHTTPProxy.pid_file = str(DATA / "proxy.pid")
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('LIB_DIST_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.command = [os.environ.get("LIB_DIST_PROXY", str(DEFAULT_PROXY))]

c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = STUDENTS | {INSTRUCTOR}
c.Authenticator.admin_users = {INSTRUCTOR}

# The single-user servers: this environment's JupyterLab, nbgrader's settings from deploy/jupyter.
# Students' kernels import the student edition of lib_dist (the labs' answers are stubs); the
# lecture edition (answers compiled, no source) comes with its own kernel, found on JUPYTER_PATH.
LABS = Path(os.environ.get("LIB_DIST_LABS", HERE.parent / "labs"))
c.Spawner.cmd = [str(Path(sys.prefix) / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.environment = {
    "JUPYTER_CONFIG_PATH": str(HERE / "jupyter"),
    "PYTHONPATH": str(LABS / "student_edition"),
    "JUPYTER_PATH": str(LABS / "lecture_edition" / "share" / "jupyter"),
    "PATH": f"{Path(sys.prefix) / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",  # alembic, ...
    **{
    name: os.environ[name] for name in ("LIB_DIST_EXCHANGE", "LIB_DIST_COURSE_ID")
    if name in os.environ}}
c.Spawner.http_timeout = 60
c.Spawner.start_timeout = 120
