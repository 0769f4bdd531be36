"""A two-node SLURM job, each node's /tmp private to the job, seen from either node (#22).

Two simulated hosts (network namespaces joined by a switch, each its own hostname and
interface ``ddpt0``: tests/netns.py) are two SLURM nodes: slurmctld on the first, a slurmd
on each (tests/slurm.py), and SLURM's ``job_container/tmpfs`` giving every job its own /tmp
and /dev/shm on every node, as clusters that share nodes configure it. The job is a DDP
script written for SLURM (``srun -N 2 -n 4 python train.py``, ``ddptop.install()`` first,
no torchrun, no node agent), multi-node as docs/clusters.md says: ``DDPTOP_BIND=0.0.0.0`` and a
shared ``DDPTOP_TOKEN``.

A person on either node, in an SSH session outside the job (the node's own /tmp, where the
ranks' records are not), types ``ddptop snapshot slurm:JOB``: it finds this node's ranks in
the job's private /tmp (through /proc/PID/root, touching nothing of theirs) and the other
node's through the job's store, and shows all four training. ``ddptop jobs`` there names
the job by SLURM's id and name. Skipped with the reason where the machine cannot (not root,
SLURM missing, no network namespaces).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddptop.proctree import stop_tree
from ddptop.store import discovery
from ddptop.store.discovery import Endpoint
from tests import netns, slurm
from tests.jobs import BIN, PROBES, ddptop_cmd
from tests.ports import namespace_port

# One worker: the module's one cluster serves every test (make test: --dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm-two-nodes")]
REASON = slurm.missing() or netns.unavailable()
TOKEN = "slurm-two-nodes-token"


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm.Cluster]:
    if REASON:
        pytest.skip(REASON)
    with netns.hosts(2, ifname="ddpt0") as made, \
            slurm.cluster(tmp_path_factory.mktemp("slurm2"), {}, hosts=made, private_tmp=True) as cluster:
        cluster.env["VIEWER_RUNTIME_DIR"] = str(_nodes_own_runtime_dir(tmp_path_factory.mktemp("node-rt")))
        yield cluster


def _nodes_own_runtime_dir(path: Path) -> Path:
    """The nodes' own runtime directory, where a person's shell outside the job looks: the
    records of ended jobs 1.0-3.0 of an earlier cluster are there (#49: the fresh cluster
    numbers its first job 1 again; those entries once won over the live ranks), four ranks
    each on host "vm", their pids gone, written by the product's own writer."""
    path.chmod(0o700)
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    for job in ("1.0", "2.0", "3.0"):
        for rank in range(4):
            discovery.write_entry(Endpoint(job_id=job, rank=rank, world_size=4, host="vm", port=41000 + rank,
                                           pid=gone.pid, start_time=time.time() - 86400, node="vm",
                                           scheduler_job=job, job_name="ddp-two-nodes"), path)
    return path


def _env(cluster: slurm.Cluster, **extra: str) -> dict[str, str]:
    """No DDPTOP_RUNTIME_DIR nor XDG_RUNTIME_DIR: the ranks use their /tmp, which SLURM makes
    private to the job."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DDPTOP_", "SLURM_")) and k != "XDG_RUNTIME_DIR"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               SLURM_CONF=cluster.env["SLURM_CONF"], DDPTOP_TOKEN=TOKEN, **extra)
    return env


def _viewer(cluster: slurm.Cluster, on: netns.Host, *args: str) -> subprocess.CompletedProcess[str]:
    """A ddptop verb typed on node *on*, outside the job (bounded), in the node's own runtime
    directory (never the machine's: tests are hermetic, tests/hermetic.py)."""
    env = _env(cluster, DDPTOP_RUNTIME_DIR=cluster.env["VIEWER_RUNTIME_DIR"])
    return subprocess.run(cluster.command(ddptop_cmd(*args), on=on), env=env, capture_output=True,
                          text=True, timeout=90, check=False)


@pytest.fixture
def two_node_job(two_nodes: slurm.Cluster, tmp_path: Path,
                 request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``srun -N 2 -n 4`` of probes/slurm_ddp.py, started on node a; (srun, SLURM job.step, log).
    Parametrised with a dict: the probe's planted failure (PROBE_* variables)."""
    a = two_nodes.hosts[0]
    plant = dict(getattr(request, "param", {"PROBE_DEATH": "none"}))
    env = _env(two_nodes, MASTER_ADDR=a.address, MASTER_PORT=str(namespace_port()),
               GLOO_SOCKET_IFNAME="ddpt0", DDPTOP_BIND="0.0.0.0", DDPTOP_INTERVAL="0.25",
               PROBE_SECONDS="120", **plant)
    # The checkout as the jobs reach it (under their private /tmp a CI clone is bound elsewhere).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(two_nodes.job_root), env.get("PYTHONPATH", "")) if p)
    argv = ["srun", "-N", "2", "-n", "4", "--ntasks-per-node", "2", "--job-name", "ddp-two-nodes",
            f"--chdir={two_nodes.job_root}", str(two_nodes.job_path(BIN / "python")),
            str(two_nodes.job_path(PROBES / "slurm_ddp.py"))]
    log = tmp_path / "srun.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(two_nodes.command(argv), env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        steps: set[str] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            found = [line.split()[-4] for line in log.read_text(errors="replace").splitlines()
                     if ": slurm job " in line]
            if len(found) == 4:
                steps = set(found)
                break
            time.sleep(0.2)
        assert len(steps) == 1, log.read_text(errors="replace")[-3000:]
        yield proc, steps.pop(), log
    finally:
        two_nodes.run("scancel", "--name", "ddp-two-nodes")
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop_tree(proc)
        print(log.read_text(errors="replace")[-3000:])


def _all_training(cluster: slurm.Cluster, on: netns.Host, target: str) -> dict[str, Any]:
    """`ddptop snapshot --json TARGET` on *on* until all four ranks train (bounded)."""
    deadline = time.monotonic() + 120
    last = ""
    while time.monotonic() < deadline:
        res = _viewer(cluster, on, "snapshot", "--json", "--timeout", "2", target)
        last = res.stderr.strip() or res.stdout[-1000:]
        doc = json.loads(res.stdout) if res.stdout.strip() else None
        if doc and sorted(r["rank"] for r in doc["ranks"] if r["status"] == "running" and r["step"] > 0) \
                == [0, 1, 2, 3]:
            return dict(doc)
        time.sleep(0.5)
    raise AssertionError(f"four training ranks never seen from {on.hostname}: {last}")


def test_a_two_node_job_with_private_tmp_is_seen_whole_from_either_node(
        two_nodes: slurm.Cluster, two_node_job: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    a, b = two_nodes.hosts
    _proc, step, _log = two_node_job
    # Outside the job, this node's /tmp holds no record of it: the ranks' /tmp is the job's.
    for host in (a, b):
        doc = _all_training(two_nodes, host, f"slurm:{step.split('.')[0]}")
        assert doc["job"]["id"] == step and doc["job"]["world_size"] == 4, doc["job"]
        assert {r["rank"]: r["host"] for r in doc["ranks"]} == {
            0: a.hostname, 1: a.hostname, 2: b.hostname, 3: b.hostname}, doc["ranks"]
    # `ddptop jobs` on node b: SLURM's id and name, and where the records were found.
    res = _viewer(two_nodes, b, "jobs", "--json")
    rows = [r for r in json.loads(res.stdout)["jobs"] if r["job_id"] == step]
    assert rows and rows[0]["scheduler_job"] == step and rows[0]["job_name"] == "ddp-two-nodes", res.stdout
    assert rows[0]["runtime_dir"].startswith("/proc/") and rows[0]["ranks"] == [2, 3], rows[0]
    # install() alone: the node's first task started its node agent, which serves beyond
    # loopback and exchanges news with the other node's (its record, in the job's /tmp, says so).
    record = Path(rows[0]["runtime_dir"]) / "jobs" / step / "job.json"
    deadline = time.monotonic() + 60
    while "exchanged news with 1 of 1" not in (text := record.read_text() if record.exists() else ""):
        assert time.monotonic() < deadline, text
        time.sleep(0.2)
    table = _viewer(two_nodes, b, "jobs").stdout
    assert "SLURM JOB" in table and "ddp-two-nodes" in table, table
    # A job that is not there: one line saying where ddptop looked.
    res = _viewer(two_nodes, b, "snapshot", "slurm:999999")
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "private /tmp of other mount namespaces" in lines[0], lines[0]


WEDGE = {"PROBE_DEATH": "wedge_gil", "PROBE_DIE_RANK": "3", "PROBE_DIE_AT_STEP": "10", "PROBE_WEDGE_S": "100"}


@pytest.mark.long  # a wedged rank read from outside: tests/test_stacks_outside.py on one node
@pytest.mark.parametrize("two_node_job", [WEDGE], indirect=True, ids=["rank-3-wedged"])
def test_a_rank_wedged_on_the_other_node_is_read_from_outside_there_and_named_here(
        two_nodes: slurm.Cluster, two_node_job: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    """Rank 3, on node b, wedges in C holding the GIL: its reporter cannot answer. Node b's
    agent (started by the node's first task, install() alone) reads its stack from outside;
    `doctor` typed on node a names rank 3 with the frame it is stuck in."""
    a, _b = two_nodes.hosts
    _proc, step, log = two_node_job
    deadline = time.monotonic() + 120
    while "wedged in C holding the GIL" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    found: list[dict[str, Any]] = []
    out = ""
    while not found and time.monotonic() < deadline + 60:
        res = _viewer(two_nodes, a, "doctor", "--json", "--watch", "1", f"slurm:{step}")
        out = res.stdout[-2000:] + res.stderr[-1000:]
        doc = json.loads(res.stdout) if res.stdout.strip() else {"findings": []}
        found = [f for f in doc["findings"] if f["kind"] == "rank_unresponsive"]
    assert found and found[0]["ranks"] == [3] and "wedge()" in str(found[0]["title"]), out
