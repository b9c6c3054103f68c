"""A one-node Slurm cluster for the tests, started from Debian's slurm-wlm and munge.

munged (its own key and socket), slurmctld and slurmd run as the current user with a
configuration in a temporary folder, on ports the OS had free. The node declares 8 CPUs
whatever the machine has (`SlurmdParameters=config_overrides`): 4 engine tasks and the
controller's task then fit on a 2-core laptop. `stop` cancels every job and ends the daemons.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from local_servers import free_port

CONFIG = """ClusterName=libdist
SlurmctldHost={host}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmNode:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, seconds: float = 60) -> float:
        """Start munged, slurmctld and slurmd; the seconds until the node is idle."""
        begun = time.monotonic()
        for folder in ("state", "spool"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        key.chmod(0o600)
        subprocess.run(["munged", "--force", f"--socket={self.root}/munge.sock",
                        f"--key-file={key}", f"--pid-file={self.root}/munged.pid",
                        f"--log-file={self.root}/munged.log", f"--seed-file={self.root}/seed"],
                       check=True)
        self.conf.write_text(CONFIG.format(
            host=socket.gethostname().split(".")[0], root=self.root, user=getpass.getuser(),
            ctld_port=free_port(), slurmd_port=free_port()))
        subprocess.run(["slurmctld"], env=self.env, check=True)
        subprocess.run(["slurmd"], env=self.env, check=True)
        while time.monotonic() - begun < seconds:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env,
                                   capture_output=True, text=True).stdout.strip()
            if state == "idle":
                return time.monotonic() - begun
            time.sleep(0.2)
        raise RuntimeError(f"the Slurm node is not idle after {seconds} s: "
                           f"{(self.root / 'slurmd.log').read_text()[-2000:]}")

    def jobs(self) -> str:
        return subprocess.run(["squeue", "-h", "-o", "%i %j %T"], env=self.env,
                              capture_output=True, text=True).stdout

    def stop(self) -> None:
        subprocess.run(["scancel", "--user", getpass.getuser()], env=self.env)
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid_file = self.root / f"{daemon}.pid"
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
