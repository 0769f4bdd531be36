"""Live beats stale (#49): an entry whose process is gone, or whose pid a later process took,
never stands for a rank of a live job; an ended job that had the id of a live one is a job
of its own, ended.

The entries are real discovery entries written with the product's own writer into a
private runtime directory; the live ranks are real processes (this test's own, and a child
it starts and stops); the dead ones are the pids of children that ran and were reaped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddptop import api
from ddptop.client import host_jobs, targets
from ddptop.store import discovery, jobrecord, proc_start
from ddptop.store.discovery import Endpoint
from tests.jobs import ddptop_cmd


def _dead_pid() -> int:
    """The pid of a process that ran and is gone (reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing for a rank (killed after the test)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _entry(job: str, rank: int, pid: int, *, world: int = 4, host: str = "host-new", start: float = 0.0,
           proc: int = 0) -> Endpoint:
    return Endpoint(job_id=job, rank=rank, world_size=world, host=host, port=40000 + rank, pid=pid,
                    start_time=start or time.time(), node=host, proc_start=proc)


def test_a_process_is_named_by_its_pid_and_its_start() -> None:
    me = proc_start.own_start_ticks()
    assert me > 0 and proc_start.start_ticks(os.getpid()) == me
    assert proc_start.same_process(os.getpid(), me, 0.0)
    assert not proc_start.same_process(os.getpid(), me + 1, 0.0), "a later process with this pid"
    # An entry without proc_start (written before #49): its wall start decides.
    started = proc_start.wall_start(os.getpid())
    assert 0 < started <= time.time() + proc_start.WALL_SLACK_S
    assert proc_start.same_process(os.getpid(), 0, started + 1)
    assert not proc_start.same_process(os.getpid(), 0, started - 3600), "the entry predates the process"
    assert proc_start.start_ticks(_dead_pid()) == 0


def test_an_entry_whose_pid_a_later_process_took_is_stale(runtime_dir: Path) -> None:
    me = proc_start.own_start_ticks()
    discovery.write_entry(_entry("reused", 0, os.getpid(), proc=me + 12345))
    discovery.write_entry(_entry("reused", 1, os.getpid(), start=time.time() - 7200))  # older entry kind
    discovery.write_entry(_entry("mine", 0, os.getpid(), proc=me))
    assert sorted(discovery.jobs_on_host()) == ["mine"]
    assert sorted(discovery.jobs_on_host(include_stale=True)) == ["mine", "reused"]


def test_an_ended_job_with_the_id_of_a_live_one_is_a_job_of_its_own(
        runtime_dir: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """SLURM numbered a rebuilt cluster's first job 1 again: the live job 1.0 has two ranks
    here, and the directory still holds the four of the ended job 1.0 of an hour ago."""
    an_hour_ago = time.time() - 3600
    for rank in range(4):
        discovery.write_entry(_entry("1.0", rank, _dead_pid(), world=4, host="host-old", start=an_hour_ago))
    live = [_entry("1.0", 0, os.getpid(), world=2, proc=proc_start.own_start_ticks()),
            _entry("1.0", 1, sleeper.pid, world=2, proc=proc_start.start_ticks(sleeper.pid))]
    for entry in live:
        discovery.write_entry(entry)
    # The old job's black box, closed an hour ago, under the same id.
    record = jobrecord.JobRecord(job_id="1.0", world_size=4, host="host-old", start_time=an_hour_ago,
                                 end_time=an_hour_ago + 60, agent_pid=_dead_pid())
    jobrecord.write_record(record)

    found = host_jobs.scan(elsewhere=False)
    assert [e.rank for e in found.live["1.0"]] == [0, 1]
    assert {e.host for e in found.every["1.0"]} == {"host-new"}, "an ended job's entry stood for a rank"
    assert [e.rank for e in found.earlier["1.0"]] == [2, 3]

    target = targets.resolve("1.0")
    assert [e.host for e in target.endpoints] == ["host-new", "host-new"] and target.dead == []
    assert target.world_size == 2 and target.record is None, "the old black box read as this job's"

    rows = [r for r in api.jobs(include_unrecorded=True) if r.job_id == "1.0"]
    assert [(r.state, r.alive, r.world_size) for r in rows] == [("ended", 0, 4), ("running", 2, 2)], rows
    assert rows[0].hosts == ["host-old"] and rows[0].end_time == an_hour_ago + 60


def test_a_dead_rank_of_the_live_job_stays_its_dead_rank(
        runtime_dir: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """Not every stale entry is an earlier job's: rank 2 died a minute into this job."""
    now = time.time()
    me = proc_start.own_start_ticks()
    discovery.write_entry(_entry("job", 0, os.getpid(), world=3, start=now, proc=me))
    discovery.write_entry(_entry("job", 1, sleeper.pid, world=3, start=now,
                                 proc=proc_start.start_ticks(sleeper.pid)))
    discovery.write_entry(_entry("job", 2, _dead_pid(), world=3, start=now - 2))
    target = targets.resolve("job")
    assert [e.rank for e in target.endpoints] == [0, 1] and [e.rank for e in target.dead] == [2]
    assert host_jobs.scan(elsewhere=False).earlier == {}


def test_jobs_on_the_command_line_shows_the_ended_job_apart(runtime_dir: Path,
                                                          sleeper: subprocess.Popen[bytes]) -> None:
    for rank in range(2):
        discovery.write_entry(_entry("7.0", rank, _dead_pid(), world=2, host="host-old",
                                     start=time.time() - 3600))
    discovery.write_entry(_entry("7.0", 0, sleeper.pid, world=1, proc=proc_start.start_ticks(sleeper.pid)))
    res = subprocess.run(ddptop_cmd("jobs", "--all", "--json"), capture_output=True, text=True, timeout=60,
                         check=False, env=os.environ)
    assert res.returncode == 0, res.stderr
    jobs = json.loads(res.stdout)["jobs"]
    rows = [(r["state"], r["alive"], r["hosts"]) for r in jobs if r["job_id"] == "7.0"]
    assert rows == [("ended", 0, ["host-old"]), ("running", 1, ["host-new"])], res.stdout


def test_with_no_job_named_the_one_that_just_ended_is_read_though_its_agent_still_writes(
        runtime_dir: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """`ddptop doctor` right after srun returned (#54): no rank is alive here; the job scancel
    stopped a minute ago is closed, the one that just ended is still being closed by its agent
    (*sleeper*): the latter is the job that ended last."""
    # This host only: the suite's other jobs, in private /tmp of their own, are not this test's.
    monkeypatch.setattr(host_jobs.namespaces, "hidden_runtime_dirs", lambda *_args, **_kw: [])
    a_minute_ago = time.time() - 60
    jobrecord.write_record(jobrecord.JobRecord(job_id="1.0", world_size=4, host="n1", end_time=a_minute_ago,
                                               start_time=a_minute_ago - 30, agent_pid=_dead_pid()))
    just = jobrecord.JobRecord(job_id="2.0", world_size=4, host="n1", start_time=a_minute_ago + 20,
                               agent_pid=sleeper.pid)
    just.ranks = [jobrecord.RankOutcome(rank=2, pid=_dead_pid(), status="crashed", exit_code=1,
                                        time=time.time() - 1)]
    jobrecord.write_record(just)
    target = targets.resolve(None)
    assert target.job_id == "2.0" and target.ended, target
