"""The black box's parts on real files and real processes: the capped two-tier recording,
reading a job record back, retention, the runtime directory's safety, exits seen by pidfd,
and who failed first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from ddptop.agent.exits import ExitWatcher, decode_wait_status, reaped_status, zombie_status
from ddptop.agent.recording import JobRecording
from ddptop.bundle.format import SCHEMA_VERSION, Manifest
from ddptop.bundle.record_dir import read_recording
from ddptop.errors import RuntimeDirError
from ddptop.model.job import JobModel
from ddptop.protocol import CollectiveGroup, ConnectionEvent, RankExit, RankState, RecordEntry, StateMsg
from ddptop.store import discovery, jobrecord
from ddptop.store.jobrecord import JobRecord, RankOutcome
from tests.jobs import ddptop_cmd

MANIFEST = Manifest(schema_version=SCHEMA_VERSION, kind="recording", created=1000.0, job_id="bb",
                    world_size=8, ddptop_version="test")


def state(rank: int, t: float, step: int) -> RecordEntry:
    st = RankState(rank=rank, local_rank=rank, world_size=8, host="h", pid=100 + rank, job_id="bb", time=t,
                   step=step, collectives=[CollectiveGroup(pg="0", seq=3 * step)])
    return RecordEntry(time=t, rank=rank, message=StateMsg(state=st))


def test_recording_stays_under_its_cap_and_keeps_the_end_in_full(tmp_path: Path) -> None:
    cap = 256 * 1024
    rec = JobRecording(tmp_path, MANIFEST, cap_bytes=cap, segment_s=3600.0, stride_s=1.0)
    peak = 0
    ticks = 6000
    for tick in range(ticks):
        for rank in range(8):
            rec.write(state(rank, 1000.0 + tick, tick))
        if tick == 10:
            rec.write(ConnectionEvent(time=1010.0, rank=3, status="lost", reason="test"))
        if tick % 50 == 0:
            peak = max(peak, rec.bytes_on_disk)
    rec.write(RankExit(time=1000.0 + ticks, rank=5, pid=105, signal="SIGSEGV"))
    rec.close("test")
    peak = max(peak, rec.bytes_on_disk)
    assert rec.compactions >= 1, "the history never outgrew half the cap: the test proves nothing"
    assert peak <= cap and rec.bytes_on_disk <= cap, (peak, rec.bytes_on_disk, cap)
    contents = read_recording(tmp_path)
    events = contents.events
    assert [e.time for e in events] == sorted(e.time for e in events)
    # Nothing that is not a periodic state is thinned away, however old.
    assert any(isinstance(e, ConnectionEvent) and e.time == 1010.0 for e in events)
    assert any(isinstance(e, RankExit) and e.rank == 5 for e in events)
    # The last minutes are there at full rate: every tick of the newest 100, for every rank.
    last = {(e.rank, e.time) for e in events if isinstance(e, RecordEntry)}
    assert all((r, 1000.0 + t) in last for r in range(8) for t in range(ticks - 100, ticks))
    # Older history is thinned, not gone: the first hour still has states.
    assert any(isinstance(e, RecordEntry) and e.time < 1000.0 + 600 for e in events)
    # Each state once, though history and the recent tier may both hold it.
    keys = [(e.rank, e.time) for e in events if isinstance(e, RecordEntry)]
    assert len(keys) == len(set(keys))


def test_job_model_torn_down_after_the_first_failure() -> None:
    model = JobModel(job_id="j", world_size=4)
    for rank in range(4):
        model.apply(state(rank, 100.0, 7))
    model.apply(RankExit(time=101.0, rank=2, pid=102, signal="SIGKILL"))
    for rank in (0, 1, 3):
        model.apply(RankExit(time=101.2, rank=rank, pid=100 + rank, signal="SIGTERM"))
    assert model.statuses(102.0) == {0: "torn_down", 1: "torn_down", 2: "crashed", 3: "torn_down"}
    snap = {s.rank: s for s in model.snapshot(102.0).ranks}
    assert snap[2].exit_signal == "SIGKILL" and snap[2].exited_at == 101.0
    # Stopped alone (a person's Ctrl-C): nobody failed first, so nobody is a victim.
    calm = JobModel(job_id="j", world_size=2)
    for rank in range(2):
        calm.apply(state(rank, 100.0, 7))
        calm.apply(RankExit(time=101.0, rank=rank, pid=100 + rank, signal="SIGTERM"))
    assert calm.first_failure() is not None  # the earliest stop is still named
    assert set(calm.statuses(102.0).values()) <= {"terminated", "torn_down"}


def _record(job_id: str, start: float, end: float, agent_pid: int = 0) -> None:
    outcome = RankOutcome(rank=0, pid=1, status="exited")
    jobrecord.write_record(JobRecord(job_id=job_id, host="h", start_time=start, end_time=end,
                                     agent_pid=agent_pid, ranks=[outcome]))
    (jobrecord.job_dir(job_id) / "history.ddptop").write_bytes(b"x" * 100_000)
    discovery.rank_file(job_id, 0, "crash").write_text("# crash file\n")


def test_prune_by_age_then_size_never_a_running_job(runtime_dir: Path) -> None:
    now = time.time()
    _record("old", now - 10 * 86400, now - 9 * 86400)
    _record("mid", now - 3 * 86400, now - 2 * 86400)
    _record("new", now - 3600, now - 60)
    _record("run", now - 7200, 0.0, agent_pid=os.getpid())  # still running: never pruned
    _record("old.x", now - 3600, now - 60)  # an id that starts like another's
    result = jobrecord.prune(max_age_s=7 * 86400, max_total_bytes=350_000, now=now)
    assert result.removed == ["old", "mid"], result
    left = sorted(r.job_id for r in jobrecord.list_records())
    assert left == ["new", "old.x", "run"]
    assert not discovery.rank_file("old", 0, "crash").exists()
    assert discovery.rank_file("old.x", 0, "crash").exists()
    res = subprocess.run(ddptop_cmd("jobs", "--prune", "--keep-days", "0"), capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0 and "pruned 2 job(s)" in res.stdout, res
    assert [r.job_id for r in jobrecord.list_records()] == ["run"]


def test_jobs_lists_ended_jobs_with_outcomes(runtime_dir: Path) -> None:
    jobrecord.write_record(JobRecord(
        job_id="done", host="h", command=["torchrun", "x.py"], start_time=time.time() - 60,
        end_time=time.time() - 5, exit_code=1, world_size=2,
        ranks=[RankOutcome(rank=0, pid=1, status="torn_down", signal="SIGTERM", time=2.0),
               RankOutcome(rank=1, pid=2, status="crashed", signal="SIGSEGV", time=1.0)]))
    res = subprocess.run(ddptop_cmd("jobs", "--json"), capture_output=True, text=True, timeout=60,
                         check=False)
    # By id: a job another test runs in a private /tmp is listed too (#22).
    row = next(r for r in json.loads(res.stdout)["jobs"] if r["job_id"] == "done")
    assert (row["job_id"], row["state"], row["exit_code"]) == ("done", "ended", 1)
    assert [o["status"] for o in row["outcome"]] == ["torn_down", "crashed"]
    table = subprocess.run(ddptop_cmd("jobs"), capture_output=True, text=True, timeout=60, check=False)
    assert "rank 1 crashed (SIGSEGV), 1 torn down" in table.stdout, table.stdout


def test_runtime_dir_symlink_or_foreign_owner_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    env = dict(os.environ, DDPTOP_RUNTIME_DIR=str(link))
    code = "import os; print('training ran', os.environ.get('DDPTOP_DISABLE'))"
    res = subprocess.run(ddptop_cmd("launch", "--", sys.executable, "-c", code), env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    # The job runs, blind, and says why in one line; nothing is written through the link.
    assert res.returncode == 0 and res.stdout.strip() == "training ran 1", res
    assert res.stderr.count("\n") == 1 and "is not a directory (a symlink?)" in res.stderr, res
    assert "running the job without ddptop" in res.stderr and not list(real.iterdir())
    with pytest.raises(RuntimeDirError):
        discovery.check_private_dir(link)
    if os.getuid() != 0:
        pytest.skip("making a directory another user's needs root (chown)")
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(RuntimeDirError, match="belongs to uid 65534"):
        discovery.check_private_dir(foreign)


def test_exit_watcher_reads_codes_and_signals_of_processes() -> None:
    code = subprocess.Popen([sys.executable, "-c", "import os; os._exit(3)"])
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watcher = ExitWatcher()
    try:
        watcher.watch(1, code.pid)
        watcher.watch(2, killed.pid)
        os.kill(killed.pid, signal.SIGKILL)
        seen = {}
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            for gone in watcher.poll(0.5):
                seen[gone.key] = gone
        assert (seen[1].exit_code, seen[1].signal) == (3, "")
        assert (seen[2].exit_code, seen[2].signal) == (None, "SIGKILL")
    finally:
        watcher.close()
        for proc in (code, killed):
            proc.kill()
            proc.wait(timeout=10)
    # A process already reaped when watching starts: gone, status unknown.
    done = subprocess.run([sys.executable, "-c", "pass"], check=True)
    del done
    gone_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_pid.wait(timeout=30)
    late = ExitWatcher()
    late.watch(7, gone_pid.pid)
    (only,) = late.poll(0)
    assert only.key == 7 and not only.known
    late.close()
    assert decode_wait_status(11) == (None, "SIGSEGV") and decode_wait_status(256) == (1, "")


def _reaped_status_told() -> bool:
    """Whether this kernel tells a reaped process's status through its pidfd (Linux >= 6.15)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    fd = os.pidfd_open(proc.pid)
    try:
        proc.wait(timeout=30)
        return reaped_status(fd) is not None
    finally:
        os.close(fd)


def test_exit_watcher_reads_the_status_of_a_process_its_parent_reaped_first() -> None:
    """slurmstepd waits on its tasks, so under srun a rank is reaped before the node agent can
    read its zombie: the pidfd the agent holds still tells how it ended (exit code, signal)."""
    if not _reaped_status_told():
        pytest.skip("this kernel keeps no exit status for a pidfd (PIDFD_INFO_EXIT: Linux >= 6.15)")
    code = subprocess.Popen([sys.executable, "-c", "raise SystemExit('bad shard 7')"],
                            stderr=subprocess.DEVNULL)
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watcher = ExitWatcher()
    try:
        watcher.watch(1, code.pid)
        watcher.watch(2, killed.pid)
        killed.kill()
        for proc in (code, killed):
            proc.wait(timeout=30)  # reaped here, by its parent, before the watcher looks
            assert zombie_status(proc.pid) is None
        seen = {}
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            for gone in watcher.poll(0.5):
                seen[gone.key] = gone
        assert (seen[1].exit_code, seen[1].signal) == (1, "")
        assert (seen[2].exit_code, seen[2].signal) == (None, "SIGKILL")
    finally:
        watcher.close()


def test_job_record_rejects_a_record_naming_another_directory(runtime_dir: Path) -> None:
    jobrecord.write_record(JobRecord(job_id="a", host="h"))
    (jobrecord.job_dir("a") / "job.json").write_bytes(msgspec.json.encode(JobRecord(job_id="../b", host="h")))
    assert jobrecord.list_records() == []


def test_one_oom_kill_is_put_to_one_rank_of_a_shared_cgroup(tmp_path: Path) -> None:
    """Ranks share a memory cgroup: after one OOM kill, the next SIGKILL (torchrun's teardown)
    is not an OOM kill too, unless the cgroup counts another."""
    from ddptop.agent.oom import OOM_KILL, MemoryCgroup, MemoryWatch

    control = tmp_path / "memory.oom_control"
    (tmp_path / "memory.limit_in_bytes").write_text(str(1536 << 20))
    (tmp_path / "memory.max_usage_in_bytes").write_text(str(1500 << 20))
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    cgroup = MemoryCgroup(tmp_path, v2=False)
    watch = MemoryWatch()
    for rank in range(3):
        watch.watch(rank, 9_990_000 + rank, cgroup)  # above any pid_max: never in the kernel log
    assert watch.verdict(0, 9_990_000, "SIGKILL").cause == ""  # nothing moved: someone else's SIGKILL
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    first = watch.verdict(1, 9_990_001, "SIGKILL")
    assert (first.cause, first.limit_bytes, first.peak_bytes) == (OOM_KILL, 1536 << 20, 1500 << 20)
    assert watch.verdict(2, 9_990_002, "SIGKILL").cause == ""  # the same kill is not put to a second rank
    assert watch.verdict(2, 9_990_002, "SIGTERM").cause == ""


def test_a_rank_that_lost_its_peer_is_never_first_whatever_the_clocks_say() -> None:
    """Across hosts each agent sees exits a poll apart: a victim's exit (gloo's "Connection
    closed by peer") may carry an earlier time than the SIGKILL of the rank it lost. It is
    still the victim: the killed rank is first, the victim torn down."""
    from ddptop.model.outcome import ending_of, first_failure, resolved_status
    from ddptop.protocol import RankExit, RankState
    from ddptop.status import Status

    said = RankState(rank=0, local_rank=0, world_size=4, host="a", pid=10, status=Status.CRASHED, time=99.0,
                     exit_reason="RuntimeError: [pair.cc:553] Connection closed by peer [192.0.2.2]:30393")
    victim = ending_of(0, RankExit(time=100.00, rank=0, pid=10, host="a", exit_code=1), said, None)
    killed = ending_of(2, RankExit(time=100.05, rank=2, pid=20, host="b", signal="SIGKILL"), None, None)
    assert victim is not None and killed is not None and victim.peer_gone and not killed.peer_gone
    first = first_failure([victim, killed])
    assert first is not None and first.rank == 2
    assert resolved_status(victim, first) == Status.TORN_DOWN
    assert resolved_status(killed, first) == killed.status


def test_a_rank_sigtermed_in_the_same_poll_as_a_crash_is_torn_down() -> None:
    """Exits the agent sees in one poll (a loaded machine delays it) carry its clock at that
    poll in no order: torchrun's SIGTERM of rank 0 may read a few ms before rank 1's SIGSEGV.
    Rank 0 is still a victim; a SIGTERM seconds before the crash is not (seen in a full run)."""
    from ddptop.model.outcome import ending_of, first_failure, resolved_status
    from ddptop.protocol import RankExit
    from ddptop.status import Status

    crash = ending_of(1, RankExit(time=100.004, rank=1, pid=11, host="a", signal="SIGSEGV"), None, None)
    same_poll = ending_of(0, RankExit(time=100.001, rank=0, pid=10, host="a", signal="SIGTERM"), None, None)
    earlier = ending_of(2, RankExit(time=97.0, rank=2, pid=12, host="a", signal="SIGTERM"), None, None)
    assert crash is not None and same_poll is not None and earlier is not None
    first = first_failure([crash, same_poll, earlier])
    assert first is not None and first.rank == 1
    assert resolved_status(same_poll, first) == Status.TORN_DOWN
    assert resolved_status(earlier, first) == Status.TERMINATED
