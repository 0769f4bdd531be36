"""Ranks however they are launched (#22 item 1): the launcher's variables (torchrun, SLURM's
srun, Open MPI, PMI) or, with none, the process group itself once ``init_process_group`` ran.

The spawn test runs a real ``torch.multiprocessing.spawn`` job (no launcher, no RANK) whose
workers call ``ddptop.install()`` first, as the README says, and looks at it with the real
CLI. The variables' reading is checked on the values each launcher documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.reporter import is_rank_process
from ddptop.reporter.config import config_from_env, job_id_from_env
from ddptop.reporter.identity import RankIdentity, from_env, slurm_job
from tests.jobs import PROBES, JobRunner, RunningJob, wait_until
from tests.ports import unused_port


def test_each_launchers_variables_name_the_rank() -> None:
    slurm = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "4242",
             "SLURM_STEP_ID": "0"}
    assert from_env(slurm) == RankIdentity(rank=5, local_rank=1, world_size=8, source="slurm",
                                           scheduler_job="4242.0")
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}
    assert from_env(ompi) == RankIdentity(rank=3, local_rank=3, world_size=4, source="openmpi")
    pmi = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"}
    assert from_env(pmi) == RankIdentity(rank=2, local_rank=0, world_size=4, source="pmi")
    # torchrun under srun: torchrun's numbering is the process group's.
    both = {**slurm, "RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}
    assert from_env(both) == RankIdentity(rank=9, local_rank=1, world_size=16, source="torchrun",
                                          scheduler_job="4242.0")
    assert from_env({}) is None and from_env({"RANK": "x"}) is None and from_env({"RANK": "-1"}) is None
    assert from_env({"SLURM_PROCID": "2"}) == RankIdentity(rank=2, local_rank=2, world_size=3, source="slurm")


def test_slurms_names_make_the_job_id() -> None:
    assert slurm_job({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}) == "4242.3"
    assert slurm_job({"SLURM_JOB_ID": "4242"}) == "4242"
    assert slurm_job({"SLURM_JOB_ID": "../../etc", "SLURM_STEP_ID": "0"}) == ""
    assert job_id_from_env({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "MASTER_ADDR": "n1",
                            "MASTER_PORT": "29500"}) == "4242.0"
    assert job_id_from_env({"TORCHELASTIC_RUN_ID": "rdzv7", "SLURM_JOB_ID": "4242"}) == "rdzv7"
    assert job_id_from_env({}, store="127.0.0.1-29533") == "127.0.0.1-29533"
    config = config_from_env({"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
                              "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"})
    assert (config.rank, config.local_rank, config.world_size, config.job_id) == (1, 1, 4, "77.0")


def test_a_ranks_children_are_not_ranks() -> None:
    env = {"SLURM_PROCID": "0"}
    assert is_rank_process(env)
    assert not is_rank_process({**env, "DDPTOP_OWNER_PID": str(os.getpid() + 1)})  # a DataLoader worker
    assert not is_rank_process({**env, "DDPTOP_DISABLE": "1"})
    assert not is_rank_process({})


@pytest.fixture
def spawned(job_runner: JobRunner, tmp_path: Path) -> tuple[RunningJob, Path]:
    """`python probes/spawned.py`: two workers of torch.multiprocessing.spawn, no launcher."""
    port = unused_port()
    release = tmp_path / "release"
    env = job_runner.env({"PROBE_PORT": str(port), "PROBE_RELEASE": str(release), "PROBE_SECONDS": "90",
                          "DDPTOP_INTERVAL": "0.25"})
    log_path = tmp_path / "spawned.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, str(PROBES / "spawned.py")], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    job = RunningJob(job_id=f"127.0.0.1-{port}", proc=proc, runtime_dir=job_runner.runtime_dir,
                     log_path=log_path, env=env)
    job_runner.jobs.append(job)  # stopped with the others at teardown
    return job, release


def test_ranks_of_torch_multiprocessing_spawn_are_seen_from_their_process_group(
        spawned: tuple[RunningJob, Path]) -> None:
    job, release = spawned
    job.wait_log_all(r"rank (\d): install\(\) returned (\w+)", 2, timeout=60)
    snap = job.wait_for(lambda s: [(r["rank"], r["status"], r["step"]) for r in s["ranks"]]
                        == [(0, "running", 20), (1, "running", 20)], timeout=90)
    assert snap["job"]["id"] == job.job_id and snap["job"]["world_size"] == 2, snap["job"]
    log = job.log()
    # install() could not act at once: it said why, once per process, and started later.
    assert log.count("ddptop: no rank yet") == 2, log
    assert "install() returned False" in log
    release.touch()
    assert job.wait(timeout=60) == 0, job.log()[-2000:]
    # The job left a black box (rank 0 started the node agent): its record says how it ended.
    def ended() -> list[str]:
        res = job.run_cli("jobs", "--json")
        found = [j for j in json.loads(res.stdout)["jobs"] if j["job_id"] == job.job_id]
        return [o["status"] for o in found[0]["outcome"]] if found and found[0]["state"] == "ended" else []
    wait_until(lambda: ended() == ["exited", "exited"], 60.0, "the job's record to say both ranks exited")
