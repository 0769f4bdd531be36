"""Recording, killing the recorder, replaying, and exporting real torchrun jobs."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ddptop.bundle.format import CrashFile
from ddptop.bundle.reader import read_file
from ddptop.bundle.replay_source import ReplaySource
from ddptop.errors import BundleError
from ddptop.protocol import FrTraceMsg, HistoryMsg, RecordEntry, StacksMsg, StateMsg
from tests.jobs import JobRunner, RunningJob, ddptop_cmd
from tests.test_bundle_format import CANARIES

pytestmark = pytest.mark.slow


def _assert_no_canary(path: Path) -> None:
    raw = path.read_bytes()
    plain = gzip.decompress(raw)
    for value in CANARIES.values():
        assert value.encode() not in raw and value.encode() not in plain, value


def _recorder(job: RunningJob, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(ddptop_cmd("record", "-o", str(out), job.job_id), env=job.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _has_states(path: Path, ranks: int) -> bool:
    """True once the file at *path* reads and holds a state of each of *ranks* ranks."""
    try:
        contents = read_file(path)
    except BundleError:
        return False  # not written yet, or cut inside its first member
    seen = {e.rank for e in contents.events if isinstance(e, RecordEntry) and isinstance(e.message, StateMsg)}
    return len(seen) >= ranks


def _crash_time(source: ReplaySource, rank: int) -> float:
    for event in source.contents.events:
        if (isinstance(event, RecordEntry) and isinstance(event.message, StateMsg)
                and event.message.state.rank == rank and event.message.state.status == "crashed"):
            return event.time
    raise AssertionError("no crashed state recorded")


def test_record_sigsegv_rank_and_killed_recorder(job_runner: JobRunner, tmp_path: Path) -> None:
    job = job_runner.start("healthy", nproc=2, env={"PROBE_SECONDS": "40", **CANARIES})
    snap = job.wait_ranks(2, timeout=90)
    full, killed = tmp_path / "full.ddptop", tmp_path / "killed.ddptop"
    rec_full, rec_killed = _recorder(job, full), _recorder(job, killed)
    try:
        # Kill the recorder once its file holds states of both ranks (a flushed member).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _has_states(killed, 2):
            time.sleep(0.2)
        assert _has_states(killed, 2), "the recorder never flushed states of both ranks"
        os.kill(rec_killed.pid, signal.SIGKILL)  # mid-run: the file must still load
        rec_killed.wait(timeout=10)
        victim = next(r for r in snap["ranks"] if r["rank"] == 1)
        os.kill(victim["pid"], signal.SIGSEGV)
        _, err = rec_full.communicate(timeout=90)  # ends by itself once every rank is gone
    finally:
        for proc in (rec_full, rec_killed):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert rec_full.returncode == 0, err
    assert "recorded job" in err

    source = ReplaySource(full)
    assert source.warnings == []
    crash_t = _crash_time(source, 1)
    before = source.model_at(crash_t - 0.01)
    assert before.ranks[1].status(crash_t - 0.01) not in ("crashed", "lost")
    after = source.model_at(crash_t)
    assert after.ranks[1].status(crash_t) == "crashed"
    assert "Segmentation" in (after.ranks[1].state.exit_reason if after.ranks[1].state else "")
    first = source.first_finding_time()
    if first is not None:  # the diagnosis may report the crash, never before it happened
        assert first >= source.start_time

    partial = ReplaySource(killed)
    assert partial.warnings and len(partial.contents.events) > 0
    t = partial.end_time
    assert partial.model_at(t).ranks[0].status(t) in ("running", "stale")
    for path in (full, killed):
        _assert_no_canary(path)
        res = subprocess.run(ddptop_cmd("replay", "--info", str(path)), capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
        assert res.returncode == 0 and "recording of job" in res.stdout, res.stderr


# Through the node agents: the agent lane walked in `make test` by tests/test_agent_e2e.py; this
# variant in `make test-long`.
@pytest.mark.parametrize("via", ["ranks", pytest.param("agent", marks=pytest.mark.long)])
def test_export_live_four_rank_job(via: str, job_runner: JobRunner, tmp_path: Path) -> None:
    """The same bundle whether the viewer asks each rank or the node agent for all of them."""
    job = job_runner.start("healthy", nproc=4, env={"PROBE_SECONDS": "40", "DDPTOP_VIA": via, **CANARIES})
    # Some history in every ring buffer: each reporter has sampled a few times.
    job.wait_for(lambda s: len(s["ranks"]) == 4 and all(r["reporter"]["samples"] >= 3 for r in s["ranks"]),
                 timeout=120)
    out = tmp_path / "bundle.ddptop"
    res = job.run_cli("export", "-o", str(out), job.job_id, timeout=90)
    assert res.returncode == 0, res.stderr
    assert "states 4/4" in res.stderr and "exported job" in res.stderr
    contents = read_file(out)
    assert contents.warnings == [] and contents.end is not None
    m = contents.manifest
    assert (m.kind, m.job_id, m.world_size, m.unanswered) == ("bundle", job.job_id, 4, {})
    by_kind: dict[type, set[int]] = {}
    for event in contents.events:
        if isinstance(event, RecordEntry):
            by_kind.setdefault(type(event.message), set()).add(event.rank)
    for kind in (StateMsg, HistoryMsg, StacksMsg, FrTraceMsg):
        assert by_kind.get(kind) == {0, 1, 2, 3}, kind
    histories = [e.message for e in contents.events
                 if isinstance(e, RecordEntry) and isinstance(e.message, HistoryMsg)]
    assert all(len(h.samples) >= 2 for h in histories)
    stacks = [e.message for e in contents.events
              if isinstance(e, RecordEntry) and isinstance(e.message, StacksMsg)]
    assert all(any(t.is_main and t.frames for t in s.threads) for s in stacks)
    assert contents.hosts and sum(len(h.ranks) for h in contents.hosts) == 4
    assert contents.findings is not None
    assert not any(isinstance(c, CrashFile) for c in contents.crash_files.values())
    _assert_no_canary(out)
    source = ReplaySource(out)
    model = source.model_at(source.end_time)
    assert sorted(model.ranks) == [0, 1, 2, 3]
    assert all(v.stacks is not None for v in model.ranks.values())
