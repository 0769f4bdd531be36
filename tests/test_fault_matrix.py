"""The fault matrix: every fault ddptop must survive, on real jobs, in one parametrised test.

For each fault the test asserts three things, where the fault allows them:

* training goes on (steps advance after the fault) or, where the fault kills the job, the
  job ends by itself;
* the fault is shown, naming the right rank (snapshot, doctor, or the one line ddptop
  prints when it cannot watch);
* nothing recorded before the fault is lost: the job's black box (and a viewer's recording)
  still reads back the states from before it.

Faults: a viewer killed mid-frame; a rank SIGKILLed; a rank dying of SIGSEGV; a rank
SIGSTOPped (and continued); a rank wedged in C holding the GIL; the reporter thread raising
on every sample; the record's disk full (a real 64 KiB tmpfs; needs root); the runtime
directory unwritable.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddptop.protocol import Request
from ddptop.store.discovery import Endpoint
from ddptop.wire import HEADER, encode_frame, header_bytes
from tests.jobs import JobRunner, RunningJob, ddptop_cmd

pytestmark = pytest.mark.slow

INTERVAL = 0.25


def rank_of(snap: dict[str, Any], rank: int) -> dict[str, Any]:
    """One rank's entry of a snapshot (AssertionError if absent)."""
    found = [r for r in snap["ranks"] if r["rank"] == rank]
    assert found, snap
    return found[0]


def steps(snap: dict[str, Any]) -> dict[int, int]:
    """Step of every rank that answered."""
    return {r["rank"]: r["step"] for r in snap["ranks"]}


def goes_on(job: RunningJob, past: dict[int, int], by: int = 5, timeout: float = 60.0) -> None:
    """Training goes on: every rank's step moves *by* past what it was (bounded wait)."""
    job.wait_for(lambda s: all(steps(s).get(r, -1) >= p + by for r, p in past.items()), timeout=timeout)


def recorded_states(job: RunningJob, source: str) -> dict[int, int]:
    """Highest step per rank in a recording (a file or a job id), via `ddptop replay --info`'s
    sibling: the record read back by `ddptop doctor --json` is too coarse, so ask the reader."""
    code = ("import json, sys\n"
            "from ddptop.bundle.record_dir import read_recording\n"
            "from ddptop.protocol import RecordEntry, StateMsg\n"
            "c = read_recording(sys.argv[1]); top = {}\n"
            "for e in c.events:\n"
            "    if isinstance(e, RecordEntry) and isinstance(e.message, StateMsg):\n"
            "        top[e.rank] = max(top.get(e.rank, 0), e.message.state.step)\n"
            "print(json.dumps(top))\n")
    res = subprocess.run([sys.executable, "-c", code, source], env=job.env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return {int(k): v for k, v in json.loads(res.stdout).items()}


def record_dir(job: RunningJob) -> str:
    return str(Path(job.env.get("DDPTOP_RECORD_DIR") or job.runtime_dir / "jobs") / job.job_id)


def record_shows(job: RunningJob, rank: int, least_step: int, timeout: float = 30.0) -> None:
    """Wait (bounded) until the job's black box holds a state of *rank* at *least_step* or later.

    The recorder flushes once a second: what the rank did in the last second is on its way."""
    deadline = time.monotonic() + timeout
    seen: dict[int, int] = {}
    while time.monotonic() < deadline:
        seen = recorded_states(job, record_dir(job))
        if seen.get(rank, -1) >= least_step:
            return
        time.sleep(0.5)
    raise AssertionError(f"the record never showed rank {rank} at step >= {least_step}: {seen}")


# ---------------------------------------------------------------- faults


def viewer_killed_mid_frame(runner: JobRunner, tmp: Path) -> None:
    job = runner.start("healthy", nproc=2, interval=INTERVAL, env={"PROBE_SECONDS": "60"})
    job.wait_ranks(2)
    rec = tmp / "viewer.ddptop"
    recorder = subprocess.Popen(ddptop_cmd("record", "-o", str(rec), job.job_id), env=job.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = Endpoint.from_json((job.runtime_dir / f"{job.job_id}.0.json").read_text())
    # A raw viewer that asks for the 600-sample history and dies after a few bytes of it.
    raw = socket.create_connection((endpoint.host, endpoint.port), timeout=10)
    raw.sendall(header_bytes() + encode_frame(Request(command="history", id=1)))
    assert len(raw.recv(HEADER.size + 4)) > 0
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    # Wait (bounded) until the viewer has recorded progress of both ranks: a size threshold
    # is met by the first history frames alone, while every state is still at step 0.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (rec.exists() and rec.stat().st_size
                                                and len(progress := recorded_states(job, str(rec))) == 2
                                                and min(progress.values()) > 0):
        time.sleep(0.5)
    before = steps(job.snapshot())
    recorder.kill()  # SIGKILL, at whatever point of whatever frame it was
    raw.close()  # RST in the middle of the history frame
    recorder.wait(timeout=30)
    goes_on(job, before)
    assert rank_of(job.snapshot(), 0)["status"] == "running"
    saved = recorded_states(job, str(rec))
    assert set(saved) == {0, 1} and min(saved.values()) > 0, saved
    for rank in (0, 1):
        record_shows(job, rank, before[rank])


def rank_sigkilled(runner: JobRunner, tmp: Path) -> None:
    job = runner.start("rank_dies", nproc=3, interval=INTERVAL,
                       env={"PROBE_DEATH": "wait_for_kill", "PROBE_DIE_RANK": "1", "PROBE_DIE_AT_STEP": "10"})
    m = job.wait_log(r"rank 1: step (\d+): waiting to be killed \(pid (\d+)\)")
    step, pid = int(m.group(1)), int(m.group(2))
    job.wait_for(lambda s: rank_of(s, 1)["step"] == step, timeout=30)
    os.kill(pid, signal.SIGKILL)
    job.wait(timeout=90)
    doc = json.loads(job.run_cli("doctor", "--json", job.job_id).stdout)
    assert (doc["findings"][0]["kind"], doc["findings"][0]["ranks"][0]) == ("rank_lost", 1), doc
    assert recorded_states(job, record_dir(job))[1] == step


def rank_sigsegv(runner: JobRunner, tmp: Path) -> None:
    job = runner.start("segfault_rank", nproc=3, interval=INTERVAL,
                       env={"PROBE_CRASH_AFTER_STEPS": "15", "PROBE_CRASH_PAUSE": "2"})
    step = int(job.wait_log(r"rank 1: step (\d+): reading address 0").group(1))
    job.wait(timeout=90)
    doc = json.loads(job.run_cli("doctor", "--json", job.job_id).stdout)
    lost = doc["findings"][0]
    assert (lost["kind"], lost["ranks"][0]) == ("rank_lost", 1) and "SIGSEGV" in lost["title"], doc
    assert recorded_states(job, record_dir(job))[1] == step


def rank_sigstopped(runner: JobRunner, tmp: Path) -> None:
    job = runner.start("healthy", nproc=3, interval=INTERVAL, env={"PROBE_SECONDS": "90"})
    snap = job.wait_ranks(3)
    pid = rank_of(snap, 1)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        # Shown: rank 1 does not answer while the others do, and doctor names it.
        res = job.run_cli("snapshot", "--json", "--timeout", "2", job.job_id)
        assert res.returncode == 3 and "1" in json.loads(res.stdout)["job"]["unreachable"], res.stdout[:2000]
        named, out = False, ""
        deadline = time.monotonic() + 60
        while not named and time.monotonic() < deadline:
            out = job.run_cli("doctor", "--json", "--watch", "2", job.job_id).stdout
            found = json.loads(out)["findings"] if out.strip() else []
            named = any(f["severity"] != "info" and 1 in f["ranks"] for f in found)
        assert named, out
        before = steps(job.snapshot())
    finally:
        os.kill(pid, signal.SIGCONT)
    goes_on(job, before)
    record_shows(job, 1, 1)


def rank_wedged_holding_the_gil(runner: JobRunner, tmp: Path) -> None:
    fifo = tmp / "release"
    os.mkfifo(fifo)
    job = runner.start("rank_dies", nproc=3, interval=INTERVAL,
                       env={"PROBE_DEATH": "wedge_gil", "PROBE_DIE_RANK": "2", "PROBE_DIE_AT_STEP": "10",
                            "PROBE_WEDGE_FIFO": str(fifo)})
    job.wait_log(r"rank 2: step \d+: wedged in C holding the GIL")
    try:
        # Shown with the right rank: rank 2 cannot answer (its reporter needs the GIL), its peers can.
        res = job.run_cli("snapshot", "--json", "--timeout", "2", job.job_id)
        doc = json.loads(res.stdout)
        assert res.returncode == 3 and list(doc["job"]["unreachable"]) == ["2"], res.stdout[:2000]
        # Every rank listed (#34): the wedged one with its last state, stale, not answering.
        ranks = {r["rank"]: r for r in doc["ranks"]}
        assert sorted(ranks) == [0, 1, 2] and ranks[2]["status"] == "stale", ranks.get(2)
    finally:
        fd = os.open(fifo, os.O_RDWR)  # release the wedge whatever happened
        os.write(fd, b"x")
        os.close(fd)
    job.wait_log(r"rank 2: step \d+: unwedged", timeout=60)
    goes_on(job, {r: 10 for r in range(3)})
    record_shows(job, 2, 10)


def reporter_raising(runner: JobRunner, tmp: Path) -> None:
    job = runner.start("rank_dies", nproc=2, interval=INTERVAL,
                       env={"PROBE_DEATH": "break_reporter", "PROBE_DIE_RANK": "1", "PROBE_SECONDS": "60"})
    job.wait_log(r"rank 1: step 0: psutil broken")
    snap = job.wait_for(lambda s: rank_of(s, 1)["reporter"]["errors"] >= 3, timeout=60)
    broken = rank_of(snap, 1)
    assert "psutil is broken" in broken["reporter"]["last_error"] and broken["status"] == "running", broken
    goes_on(job, steps(snap))
    record_shows(job, 1, 1)


def record_disk_full(runner: JobRunner, tmp: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a full disk is a real 64 KiB tmpfs here: mounting one needs root")
    mnt = tmp / "records"
    mnt.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mnt)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        job = runner.start("healthy", nproc=2, interval=0.05,
                           env={"PROBE_SECONDS": "25", "DDPTOP_RECORD_DIR": str(mnt)})
        job.wait_ranks(2)
        job.wait_log(r"recording failed|no recording", timeout=120)  # the disk filled up under the recorder
        before = steps(job.snapshot())
        goes_on(job, before)
        assert job.wait(timeout=90) == 0  # the job ends as it would have, record or not
        saved = recorded_states(job, record_dir(job))
        assert set(saved) == {0, 1} and min(saved.values()) > 0, saved
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def runtime_dir_unwritable(runner: JobRunner, tmp: Path) -> None:
    blocker = tmp / "not-a-dir"
    blocker.write_text("a file where the runtime directory's parent should be\n")
    job = runner.start("healthy", nproc=2, interval=INTERVAL,
                       env={"PROBE_SECONDS": "5", "DDPTOP_RUNTIME_DIR": str(blocker / "rt")})
    assert job.wait(timeout=120) == 0, job.log()[-3000:]  # training ran to its end
    lines = [ln for ln in job.log().splitlines() if ln.startswith("ddptop:")]
    assert len(lines) == 1 and "running the job without ddptop" in lines[0], lines
    assert "Traceback" not in job.log()


FAULTS: dict[str, Callable[[JobRunner, Path], None]] = {
    "viewer killed mid-frame": viewer_killed_mid_frame,
    "rank SIGKILLed": rank_sigkilled,
    "rank SIGSEGV": rank_sigsegv,
    "rank SIGSTOPped": rank_sigstopped,
    "rank wedged holding the GIL": rank_wedged_holding_the_gil,
    "reporter thread raising": reporter_raising,
    "record disk full": record_disk_full,
    "runtime dir unwritable": runtime_dir_unwritable,
}


# The rank's own deaths are walked by tests/test_postmortem_e2e.py and test_stacks_outside.py
# too: here they are long variants (make test-long); the faults of ddptop's own parts stay.
LONG_FAULTS = frozenset(("rank SIGKILLed", "rank SIGSEGV", "rank SIGSTOPped", "rank wedged holding the GIL"))


@pytest.mark.parametrize("fault", [pytest.param(f, marks=pytest.mark.long) if f in LONG_FAULTS else f
                                   for f in FAULTS])
def test_fault(fault: str, job_runner: JobRunner, tmp_path: Path) -> None:
    FAULTS[fault](job_runner, tmp_path)
