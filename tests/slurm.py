"""A real one-node SLURM cluster for a test: munged, slurmctld and slurmd from Debian's
packages (``make test`` installs them where it runs as root with apt), started by the test
on private sockets, ports and directories, and stopped by their own pids.

Nothing of the machine's own SLURM or munge set-up is used or touched: the key, the socket,
the state and spool directories and ``slurm.conf`` live in the test's temporary directory,
and every client command gets ``SLURM_CONF`` pointing there. Jobs are cancelled before the
daemons stop. Where the machine cannot (not root, the packages missing), the test is
skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("srun", "sinfo", "squeue", "scancel")


def missing() -> str:
    """Why a SLURM cluster cannot be started here ("" when it can)."""
    if os.geteuid() != 0:
        return "a test SLURM cluster needs root (slurmd runs jobs as their users)"
    absent = [p for p in DAEMONS if not os.access(p, os.X_OK)] + [c for c in CLIENTS if not shutil.which(c)]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)}): "
                "apt-get install slurmctld slurmd slurm-client munge")
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """A running test cluster: its directory, the environment its clients need, its daemons."""

    root: Path
    env: dict[str, str]
    node: str
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A client command against this cluster (bounded)."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False)

    def job_state(self, job_id: str) -> str:
        """squeue's state of *job_id* ("" once it left the queue)."""
        res = self.run("squeue", "-h", "-j", job_id, "-o", "%T")
        return res.stdout.strip() if res.returncode == 0 else ""

    def log(self) -> str:
        """The daemons' logs, for a failure message."""
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.root / name
            if path.exists():
                out.append(f"--- {name}:\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(out)


def _conf(root: Path, node: str, ctld_port: int, d_port: int) -> str:
    return f"""ClusterName=ddptoptest
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
KillWait=5
NodeName={node} CPUs=8 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


@contextmanager
def cluster(root: Path, base_env: dict[str, str]) -> Iterator[Cluster]:
    """Start munged, slurmctld and slurmd under *root*; cancel every job and stop them after."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    node = socket.gethostname().split(".")[0]
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, node, _free_port(), _free_port()))
    env = {**base_env, "SLURM_CONF": str(conf)}
    for name in [n for n in env if n.startswith("SLURM_") and n != "SLURM_CONF"]:
        del env[name]  # a test run inside an allocation must not talk to that one
    made = Cluster(root=root, env=env, node=node)
    commands = [
        [DAEMONS[0], "-F", "-f", f"--socket={root}/munge.sock", f"--key-file={key}",
         f"--pid-file={root}/munged.pid", f"--seed-file={root}/munge.seed", f"--log-file={root}/munged.log"],
        [DAEMONS[1], "-D", "-i", "-f", str(conf)],
        [DAEMONS[2], "-D", "-f", str(conf)],
    ]
    try:
        for argv in commands:
            with open(root / f"{Path(argv[0]).name}.out", "wb") as out:
                made.daemons.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                     start_new_session=True))
            if argv[0] == DAEMONS[0]:
                _wait(lambda: (root / "munge.sock").exists(), 15.0, "munged's socket", made)
        _wait(lambda: made.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle", 60.0,
              "the node to be idle", made)
        yield made
    finally:
        if made.daemons and made.daemons[-1].poll() is None:
            made.run("scancel", "--full", "-u", "root", timeout=30)
            _wait(lambda: not made.run("squeue", "-h", "-o", "%i").stdout.strip(), 30.0, "jobs to end", made,
                  fail=False)
        for proc in reversed(made.daemons):
            _stop(proc)


def _wait(predicate: Callable[[], object], timeout: float, what: str, made: Cluster,
          fail: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if any(p.poll() is not None for p in made.daemons):
            break
        time.sleep(0.2)
    if fail:
        raise AssertionError(f"the test SLURM cluster: no {what} within {timeout}s\n{made.log()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
