"""ddptop on a real SLURM cluster (#22): one node's munged, slurmctld and slurmd, started by
the test itself (tests/slurm.py), and a DDP script written for SLURM launched by ``srun``,
no torchrun: ranks from SLURM_PROCID, ``ddptop.install()`` first, as the README says.

Skipped with the reason where the machine cannot run SLURM (not root, packages missing:
``make test`` installs them where it runs as root with apt)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slurm
from tests.jobs import PROBES, JobRunner, RunningJob, alone_on_host, ddptop_cmd
from tests.ports import unused_port
from tests.story_check import assert_one_story_json

# One worker: the module's one cluster serves every test (make test: --dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]
REASON = slurm.missing()
# Record directories of the module's jobs that scancel stopped: the next test's host has them too,
# as a real one would (doctor with no JOB must not read them instead of the job that just ended).
ENDED_RECORDS: list[Path] = []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm.Cluster]:
    if REASON:
        pytest.skip(REASON)
    with slurm.cluster(tmp_path_factory.mktemp("slurm"), {}) as made:
        yield made


def srun(cluster: slurm.Cluster, job_runner: JobRunner, name: str, env: dict[str, str],
         tasks: int = 4, launch: bool = False, srun_args: tuple[str, ...] = ()) -> RunningJob:
    """``srun -n TASKS python probes/slurm_ddp.py`` in a session of its own (under ``ddptop
    launch --job-id NAME`` with *launch*); its job id is SLURM's job.step, read from what the
    tasks print, or NAME."""
    full = job_runner.env({**cluster.env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(unused_port()),
                           "DDPTOP_INTERVAL": "0.25", "PROBE_SECONDS": "60", **env})
    full["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    log_path = job_runner.tmp / f"{name}.log"
    argv = ["srun", "-n", str(tasks), "--job-name", name, "--kill-on-bad-exit=1", *srun_args,
            str(Path(full["PATH"].split(":")[0]) / "python"), str(PROBES / "slurm_ddp.py")]
    if launch:
        full["PROBE_NO_INSTALL"] = "1"
        argv = ddptop_cmd("launch", "--job-id", name, "--", *argv)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    job = RunningJob(job_id="", proc=proc, runtime_dir=job_runner.runtime_dir, log_path=log_path, env=full)
    job_runner.jobs.append(job)
    found = job.wait_log_all(r"rank (\d+): slurm job (\d+\.\d+)", tasks, timeout=120)
    assert len({step for _rank, step in found}) == 1, found
    job.job_id = name if launch else found[0][1]
    job.slurm_job = found[0][1].split(".")[0]  # type: ignore[attr-defined]
    return job


def test_an_srun_job_with_install_first_is_seen_with_every_rank(cluster: slurm.Cluster,
                                                                 job_runner: JobRunner) -> None:
    job = srun(cluster, job_runner, "ddptop-live", {"PROBE_DEATH": "none"})
    snap = job.wait_for(lambda s: sorted(r["rank"] for r in s["ranks"] if r["status"] == "running"
                                         and r["step"] > 0) == [0, 1, 2, 3], timeout=90)
    assert snap["job"]["id"] == job.job_id and snap["job"]["world_size"] == 4, snap["job"]
    assert not snap["job"]["unreachable"], snap["job"]
    # SLURM's own name finds it too: the job (every step) and the step.
    slurm_job = job.job_id.split(".")[0]
    for name in (f"slurm:{slurm_job}", f"slurm:{job.job_id}"):
        res = job.run_cli("snapshot", "--json", name, timeout=30)
        assert res.returncode == 0 and json.loads(res.stdout)["job"]["id"] == job.job_id, res.stderr
    cluster.run("scancel", slurm_job)
    job.wait(timeout=60)
    ENDED_RECORDS.append(job_runner.runtime_dir / "jobs" / job.job_id)


def test_a_rank_that_exits_with_a_message_under_srun_is_named_by_its_status_and_message(
        cluster: slurm.Cluster, job_runner: JobRunner) -> None:
    """``sys.exit("rank 2: bad shard 7")`` in rank 2 between two steps (#45): status 1, no
    traceback; its peers entered the next all-reduce and waited for it until srun ended them.
    Python calls no excepthook for a SystemExit: the rank's last words have its status and
    message from sys.exit. doctor names rank 2 by them, never "exited cleanly"."""
    env = {"PROBE_DEATH": "sys_exit", "PROBE_DIE_RANK": "2", "PROBE_DIE_AT_STEP": "12"}
    for earlier in ENDED_RECORDS:  # the job scancel stopped a moment ago, on this host too
        shutil.copytree(earlier, job_runner.runtime_dir / "jobs" / earlier.name)
    job = srun(cluster, job_runner, "ddptop-fail", env)
    step = int(job.wait_log(r"rank 2: step (\d+): sys.exit\('rank 2: bad shard 7'\)", timeout=90).group(1))
    job.wait(timeout=90)  # --kill-on-bad-exit: srun ends the other tasks
    # Typed right after srun returns, with no JOB (#54): the job that just ended, not the one
    # scancel stopped before it (the module's first test). Alone on the host (a /proc of its own):
    # the suite's other modules' live jobs in private /tmp would make the host's "only job" ambiguous.
    res = subprocess.run(alone_on_host(ddptop_cmd("doctor", "--json")), env=job.env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    assert json.loads(res.stdout)["job_id"] == job.job_id, res.stdout + res.stderr
    assert_one_story_json(res.stdout)
    findings = json.loads(res.stdout)["findings"]
    first = findings[0]
    assert (first["kind"], first["ranks"], first["step"]) == ("rank_lost", [2], step), first
    told = "rank 2 exited with status 1: SystemExit('rank 2: bad shard 7') after collective #"
    assert told in first["title"], first
    # Its peers waited for it (the ones whose last words the record kept: the step's end may take
    # rank 0's node agent down with the tasks before it reads every one)
    assert first["victims"] and set(first["victims"]) <= {0, 1, 3}, first
    assert not [f["title"] for f in findings if "cleanly" in f["title"]], findings
    # Its status and message, in its own last words (sys.exit's) ...
    rank2 = next(r for r in json.loads(job.run_cli("snapshot", "--json", job.job_id).stdout)["ranks"]
                 if r["rank"] == 2)
    assert (rank2["status"], rank2["exit_code"]) == ("crashed", 1), rank2
    assert rank2["exit_reason"].startswith("SystemExit('rank 2: bad shard 7')\n  sys.exit at "), rank2
    # ... and its exit status read from outside by the node agent install() spawned, though
    # slurmstepd reaped the task first (its pidfd tells); the step's end (SIGTERM) let the agent
    # close its record with every rank's end.
    rows = json.loads(job.run_cli("jobs", "--json", "--all").stdout)["jobs"]
    (row,) = [row for row in rows if row["job_id"] == job.job_id]
    assert {e.name for e in ENDED_RECORDS} <= {r["job_id"] for r in rows}, rows  # the earlier job was there
    ended = {o["rank"]: (o["status"], o["exit_code"]) for o in row["outcome"]}
    assert row["state"] == "ended" and ended[2] == ("crashed", 1), row


def _stopped_by_slurm(job: RunningJob, code: int) -> dict[str, object]:
    """doctor's first finding; *code*: 0 for an info (a cancel is the user's own), 1 for a warning."""
    res = job.run_cli("doctor", "--json", job.job_id, timeout=60)
    assert res.returncode == code, res.stdout + res.stderr
    first: dict[str, object] = json.loads(res.stdout)["findings"][0]
    assert first["kind"] == "rank_lost" and first["ranks"] == [0, 1, 2, 3], first
    return first


def test_ddptop_launch_around_srun_watches_the_tasks_and_names_scancel(cluster: slurm.Cluster,
                                                                       job_runner: JobRunner) -> None:
    """`ddptop launch -- srun -n 4 python train.py`: the script knows nothing of ddptop; the
    launcher (outside the job step, so it outlives it) records it; scancel is named as such."""
    job = srun(cluster, job_runner, "ddptop-cancel", {"PROBE_DEATH": "none"}, launch=True)
    job.wait_for(lambda s: sum(1 for r in s["ranks"] if r["status"] == "running" and r["step"] > 0) == 4,
                 timeout=90)
    cluster.run("scancel", job.slurm_job)  # type: ignore[attr-defined]
    job.wait(timeout=90)
    first = _stopped_by_slurm(job, 0)
    assert "cancelled by SLURM (scancel)" in str(first["title"]) and first["severity"] == "info", first


@pytest.mark.long  # SLURM's limits are whole minutes: a minute of waiting
def test_a_time_limit_is_named_as_such(cluster: slurm.Cluster, job_runner: JobRunner) -> None:
    """SLURM's time limit (1 minute, the shortest): SIGTERM, then SIGKILL after KillWait."""
    job = srun(cluster, job_runner, "ddptop-limit", {"PROBE_DEATH": "none", "PROBE_SECONDS": "150"},
               launch=True, srun_args=("--time=1",))
    job.wait(timeout=150)
    first = _stopped_by_slurm(job, 1)
    assert "time limit" in str(first["title"]) and first["severity"] == "warning", first


# A launch-path variant in `make test-long`: srun's own tasks are the path of `make test`, the
# black box and a wedged rank's stack under torchrun are tests/test_stacks_outside.py's.
@pytest.mark.long
def test_torchrun_per_node_under_srun_keeps_the_black_box_and_reads_a_wedged_rank(
        cluster: slurm.Cluster, job_runner: JobRunner, tmp_path: Path) -> None:
    """`srun --ntasks-per-node=1 ddptop launch -- torchrun ...`: the launcher is SLURM's task,
    torchrun's ranks its children. A rank wedged in C holding the GIL is named with its frame
    (read from outside by the node agent); then a rank fails and doctor names it afterwards."""
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    full = job_runner.env({**cluster.env, "PROBE_DEATH": "wedge_gil", "PROBE_DIE_RANK": "1",
                           "PROBE_DIE_AT_STEP": "10", "PROBE_WEDGE_FIFO": str(fifo), "PROBE_SECONDS": "60"})
    full["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    torchrun = [str(Path(full["PATH"].split(":")[0]) / "torchrun"), "--standalone", "--nproc-per-node", "2",
                str(PROBES / "rank_dies.py")]
    argv = ["srun", "--ntasks-per-node=1", "-n", "1", "--job-name", "ddptop-pernode",
            *ddptop_cmd("launch", "--job-id", "ddptop-pernode", "--interval", "0.25", "--", *torchrun)]
    log_path = tmp_path / "pernode.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    job = RunningJob(job_id="ddptop-pernode", proc=proc, runtime_dir=job_runner.runtime_dir,
                     log_path=log_path, env=full)
    job_runner.jobs.append(job)
    job.wait_log(r"rank 1: step \d+: wedged in C holding the GIL", timeout=120)
    try:
        found: list[dict[str, object]] = []
        deadline = time.monotonic() + 60
        while not found and time.monotonic() < deadline:
            out = job.run_cli("doctor", "--json", "--watch", "1", job.job_id).stdout
            found = [f for f in (json.loads(out)["findings"] if out.strip() else [])
                     if f["kind"] == "rank_unresponsive"]
        assert found and found[0]["ranks"] == [1] and "wedge()" in str(found[0]["title"]), found
    finally:
        fd = os.open(fifo, os.O_RDWR)  # release the wedge whatever happened
        os.write(fd, b"x")
        os.close(fd)
    job.wait_log(r"rank 1: step \d+: unwedged", timeout=60)
    cluster.run("scancel", "--name", "ddptop-pernode")
    job.wait(timeout=90)
    res = job.run_cli("doctor", "--json", job.job_id, timeout=60)
    first = json.loads(res.stdout)["findings"][0]
    # The launcher is a task of the job: SLURM keeps the job COMPLETING while it waits, so it
    # cannot read CANCELLED; it says what it can.
    assert "stopped by SLURM (scancel or preemption" in first["title"] and first["ranks"] == [0, 1], first
