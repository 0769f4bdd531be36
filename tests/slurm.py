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
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.netns import Host
from tests.ports import unused_port

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("srun", "sinfo", "squeue", "scancel")
# slurmd on one CPU where it makes mount namespaces for jobs (job_container/tmpfs): this
# kernel (6.18) numbers namespaces from per-CPU batches, so a job's namespace made on one CPU
# can get a smaller number than slurmd's own, made on another, and the kernel's loop check
# then refuses slurmstepd's bind of it ("ns base mount failed: Invalid argument"): seen in
# 6 of 10 jobs unpinned, 0 of 14 pinned. Its tasks inherit the pin.
PIN = ["taskset", "-c", "0"]
CHECKOUT = Path(__file__).resolve().parent.parent


def missing() -> str:
    """Why a SLURM cluster cannot be started here ("" when it can)."""
    if os.geteuid() != 0:
        return "a test SLURM cluster needs root (slurmd runs jobs as their users)"
    absent = [p for p in DAEMONS if not os.access(p, os.X_OK)] + [c for c in CLIENTS if not shutil.which(c)]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)}): "
                "apt-get install slurmctld slurmd slurm-client munge")
    return ""


@dataclass
class Cluster:
    """A running test cluster: its directory, the environment its clients need, its daemons."""

    root: Path
    env: dict[str, str]
    node: str
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    hosts: list[Host] = field(default_factory=list)  # the nodes, when they are simulated hosts
    job_root: Path = CHECKOUT  # where jobs find this checkout (see cluster(): a private /tmp)

    def job_path(self, path: Path) -> Path:
        """*path* of this checkout (its probes, its .venv) as the cluster's jobs reach it."""
        return self.job_root / path.relative_to(CHECKOUT) if path.is_relative_to(CHECKOUT) else path

    def command(self, argv: list[str], on: Host | None = None) -> list[str]:
        """*argv* as run on *on* (default: the first node; this machine for a one-node cluster)."""
        where = on or (self.hosts[0] if self.hosts else None)
        return where.command(argv) if where else argv

    def run(self, *argv: str, timeout: float = 30.0,
            on: Host | None = None) -> subprocess.CompletedProcess[str]:
        """A client command against this cluster (bounded), on node *on*."""
        return subprocess.run(self.command(list(argv), on), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def job_state(self, job_id: str) -> str:
        """squeue's state of *job_id* ("" once it left the queue)."""
        res = self.run("squeue", "-h", "-j", job_id, "-o", "%T")
        return res.stdout.strip() if res.returncode == 0 else ""

    def log(self) -> str:
        """The daemons' logs, for a failure message."""
        out = []
        names = ["slurmctld.log", "slurmd.log", "munged.log"]
        names += [f"slurmd-{h.hostname}.log" for h in self.hosts]
        for name in names:
            path = self.root / name
            if path.exists():
                out.append(f"--- {name}:\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(out)


def _conf(root: Path, node: str, ctld_port: int, d_port: int, hosts: list[Host], private_tmp: bool) -> str:
    if hosts:
        # One slurmd per simulated host, each its own node: files named by node (%n).
        ctld = f"{hosts[0].hostname}({hosts[0].address})"
        nodes = "\n".join(f"NodeName={h.hostname} NodeAddr={h.address} CPUs=8 State=UNKNOWN" for h in hosts)
        names, per_node = ",".join(h.hostname for h in hosts), "-%n"
    else:
        ctld, nodes, names, per_node = node, f"NodeName={node} CPUs=8 State=UNKNOWN", node, ""
    container = "JobContainerType=job_container/tmpfs\nPrologFlags=Contain\n" if private_tmp else ""
    return f"""ClusterName=ddptoptest
SlurmctldHost={ctld}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool{per_node}
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd{per_node}.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd{per_node}.log
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
{container}{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


@contextmanager
def cluster(root: Path, base_env: dict[str, str], hosts: list[Host] | None = None,
            private_tmp: bool = False) -> Iterator[Cluster]:
    """Start munged, slurmctld and slurmd under *root*; cancel every job and stop them after.

    With *hosts* (tests/netns.py), each host is a node: slurmctld runs on the first, a
    slurmd on each, and client commands run on the first unless told. With *private_tmp*,
    every job gets its own /tmp and /dev/shm on each node (SLURM's job_container/tmpfs, as
    clusters that share nodes configure it). slurmd runs in a mount namespace of its own
    (``ip netns exec`` makes one; ``unshare --mount`` on one node), so the mounts it makes
    for jobs die with it and never touch the machine's.
    """
    hosts = hosts or []
    root.mkdir(parents=True, exist_ok=True)
    (root / "state").mkdir(exist_ok=True)
    for name in [f"spool-{h.hostname}" for h in hosts] or ["spool"]:
        (root / name).mkdir(exist_ok=True)
    node = socket.gethostname().split(".")[0]
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, node, unused_port(), unused_port(), hosts, private_tmp))
    base = Path(tempfile.mkdtemp(prefix="ddptop-jobtmp-", dir="/var/tmp")) if private_tmp else None
    if base is not None:
        # The jobs' /tmp live under BasePath, which may not itself be under /tmp (it would
        # vanish under the job's own /tmp): /var/tmp, removed when the cluster stops.
        # SLURM adds the node's name below it (BasePath/NODE/JOB), so nodes never share one.
        (root / "job_container.conf").write_text(f"AutoBasePath=true\nBasePath={base}\n")
    env = {**base_env, "SLURM_CONF": str(conf)}
    for name in [n for n in env if n.startswith("SLURM_") and n != "SLURM_CONF"]:
        del env[name]  # a test run inside an allocation must not talk to that one
    made = Cluster(root=root, env=env, node=node, hosts=hosts)
    keep: list[str] = []
    if private_tmp and CHECKOUT.is_relative_to("/tmp"):
        # A checkout under /tmp (a CI clone) vanishes under the jobs' private /tmp: slurmd binds
        # it at a path outside /tmp in its own mount namespace, which the jobs' inherit (the
        # binding dies with slurmd); jobs are started from there (Cluster.job_path).
        made.job_root = Path(tempfile.mkdtemp(prefix="ddptop-checkout-", dir="/var/tmp"))
        keep = ["sh", "-c", f'mount --bind "{CHECKOUT}" "{made.job_root}" && exec "$@"', "slurmd"]
    munged = [DAEMONS[0], "-F", "-f", f"--socket={root}/munge.sock", f"--key-file={key}",
              f"--pid-file={root}/munged.pid", f"--seed-file={root}/munge.seed",
              f"--log-file={root}/munged.log"]
    slurmd = [DAEMONS[2], "-D", "-f", str(conf)]
    # (argv, its log's name); munged's socket is a file, reached from every namespace.
    commands = [(munged, "munged"), (made.command([DAEMONS[1], "-D", "-i", "-f", str(conf)]), "slurmctld")]
    if hosts:
        commands += [(_node_daemon(h, [*keep, *slurmd]), f"slurmd-{h.hostname}") for h in hosts]
    else:
        own_mounts = [*PIN, "unshare", "--mount", "--propagation", "private"] if private_tmp else []
        commands.append(([*own_mounts, *keep, *slurmd], "slurmd"))
    try:
        for argv, name in commands:
            with open(root / f"{name}.out", "wb") as out:
                made.daemons.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                     start_new_session=True))
            if name == "munged":
                _wait(lambda: (root / "munge.sock").exists(), 15.0, "munged's socket", made)
        count = max(1, len(hosts))
        _wait(lambda: made.run("sinfo", "-h", "-N", "-o", "%T").stdout.split() == ["idle"] * count, 60.0,
              "node to be idle", made)
        yield made
    finally:
        if len(made.daemons) == len(commands) and made.daemons[-1].poll() is None:
            made.run("scancel", "--full", "-u", "root", timeout=30)
            _wait(lambda: not made.run("squeue", "-h", "-o", "%i").stdout.strip(), 30.0, "jobs to end", made,
                  fail=False)
        for proc in reversed(made.daemons):
            _stop(proc)
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
        if made.job_root != CHECKOUT:
            made.job_root.rmdir()  # empty: the binding lived in slurmd's namespace only


def _node_daemon(host: Host, argv: list[str]) -> list[str]:
    """*argv* as a node's daemon on *host*: its network and hostname, a mount namespace of its
    own, and the machine's /sys (``ip netns exec`` mounts a fresh one, without the cgroup
    hierarchy slurmd needs)."""
    return [*PIN, "nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--uts", "--mount", "--propagation",
            "private", "sh", "-c", 'hostname "$0" && exec "$@"', host.hostname, *argv]


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
