"""Stacks from outside, on real jobs: a rank that stops answering is named, with where it is stuck.

Two silent ranks — one wedged in C code holding the GIL (probes/rank_dies.py, PROBE_DEATH=
wedge_gil, released through a FIFO), one SIGSTOPped — must be named ``rank_unresponsive`` by
``ddptop doctor --json JOB`` within 5 s of going silent, with the wedged frame (``wedge()``
at the probe's blocking line) or "stopped". Each runs with py-spy on (the default: nothing
reaches the rank; skipped, with py-spy's own words, where it cannot attach here) and with
py-spy off and the signal allowed (``DDPTOP_PYSPY=0 DDPTOP_STACKS_SIGNAL=1``: faulthandler's
SIGUSR2, which says so). Looking never changes the job: a rank asleep 30 s in C stays
asleep, and no signal is pending on a stopped rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddptop.agent.outside import pyspy_path
from ddptop.store.remains import read_stuck
from tests.jobs import PROBES, JobRunner, RunningJob

pytestmark = pytest.mark.slow

INTERVAL = 0.25
LIMIT_S = 5.0  # from going silent to the node agent's capture of where it is stuck
DOCTOR_LIMIT_S = 20.0  # to a doctor's answer (new processes on a loaded machine)
WEDGE_LINE = next(i for i, line in enumerate((PROBES / "rank_dies.py").read_text().splitlines(), 1)
                  if "libc.read(fd" in line)


def pyspy_env(use_pyspy: bool) -> dict[str, str]:
    """DDPTOP_PYSPY for the job (without py-spy, the signal is allowed: the faulthandler path);
    skips (with py-spy's own words) where py-spy cannot attach."""
    if not use_pyspy:
        return {"DDPTOP_PYSPY": "0", "DDPTOP_STACKS_SIGNAL": "1"}
    exe = pyspy_path()
    if exe is None:
        pytest.skip("py-spy is not installed (pip install 'ddptop[pyspy]')")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        res = subprocess.run([exe, "dump", "--pid", str(child.pid), "--nonblocking"], capture_output=True,
                             text=True, timeout=20, check=False)
        if res.returncode != 0 or "<module>" not in res.stdout:
            deadline = time.monotonic() + 5  # the interpreter may not have been up yet: once more
            while time.monotonic() < deadline and res.returncode != 0:
                time.sleep(0.2)
                res = subprocess.run([exe, "dump", "--pid", str(child.pid), "--nonblocking"],
                                     capture_output=True, text=True, timeout=20, check=False)
        if res.returncode != 0:
            pytest.skip(f"py-spy cannot attach here: {(res.stderr or res.stdout).strip()[:300]}")
    finally:
        child.kill()
        child.wait(timeout=10)
    return {"DDPTOP_PYSPY": exe}


def wait_unresponsive(job: RunningJob, rank: int, silent_at: float,
                      timeout: float = 30.0) -> tuple[dict[str, Any], float]:
    """Poll `ddptop doctor --json` until it names *rank* unresponsive; the finding and the
    seconds from *silent_at* (wall clock) to the node agent's first capture of where it is
    stuck (its ``.stuck`` report, watched from here; the agent reads again every 5 s).

    The agent's capture time, not the doctor's answer: each doctor is a new process (its
    start-up and its 1 s watch), whose time on a loaded machine says nothing of ddptop's
    latency; the doctor's own wall time is only bounded loosely (DOCTOR_LIMIT_S)."""
    deadline = time.monotonic() + timeout
    first = read_stuck(job.job_id, rank)
    while (first is None or first.time < silent_at) and time.monotonic() < deadline:
        time.sleep(0.05)  # the condition is the report's appearance
        first = read_stuck(job.job_id, rank)
    assert first is not None and first.time >= silent_at, f"no outside read of rank {rank} within {timeout} s"
    took = first.time - silent_at
    out = ""
    while time.monotonic() < deadline:
        out = job.run_cli("doctor", "--json", "--watch", "1", job.job_id).stdout
        found = [f for f in (json.loads(out)["findings"] if out.strip() else [])
                 if f["kind"] == "rank_unresponsive"]
        if found:
            answered = time.time() - silent_at
            assert [f["ranks"] for f in found] == [[rank]], found
            print(f"rank_unresponsive: captured after {took:.2f} s, doctor answered after {answered:.2f} s: "
                  f"{found[0]['title']}")
            assert answered <= DOCTOR_LIMIT_S, f"doctor answered after {answered:.2f} s"
            return found[0], took
    raise AssertionError(f"no rank_unresponsive within {timeout} s; last doctor output: {out[:3000]}")


def asked_for_stacks(job: RunningJob, rank: int) -> list[Any]:
    """[source, innermost function, line] of *rank*'s main thread as the stacks key gets it."""
    code = ("import json, sys\n"
            "from ddptop import auth\n"
            "from ddptop.client.live import LiveSource\n"
            "from ddptop.client.targets import resolve\n"
            "src = LiveSource(resolve(sys.argv[1]), token=auth.load_token())\n"
            "src.start(lambda event: None)\n"
            "try:\n"
            "    got = src.request_stacks([int(sys.argv[2])], timeout=2.0)\n"
            "finally:\n"
            "    src.stop()\n"
            "msg = got.stacks.get(int(sys.argv[2]))\n"
            "f = msg.threads[0].frames[-1] if msg else None\n"
            "print(json.dumps([msg.source, f.function, f.line] if msg else got.errors))\n")
    res = subprocess.run([sys.executable, "-c", code, job.job_id, str(rank)], env=job.env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout))


def recorded_outside_stacks(job: RunningJob, rank: int) -> list[list[Any]]:
    """[source, innermost function, line] of every outside read of *rank* in the job's black box."""
    code = ("import json, sys\n"
            "from ddptop.bundle.record_dir import read_recording\n"
            "from ddptop.protocol import RecordEntry, StacksMsg\n"
            "out = []\n"
            "for e in read_recording(sys.argv[1]).events:\n"
            "    m = getattr(e, 'message', None)\n"
            "    if (isinstance(e, RecordEntry) and e.rank == int(sys.argv[2]) and isinstance(m, StacksMsg)\n"
            "            and m.source and m.stuck is not None and m.stuck.frames):\n"
            "        out.append([m.source, m.stuck.frames[-1].function, m.stuck.frames[-1].line])\n"
            "print(json.dumps(out))\n")
    record = job.runtime_dir / "jobs" / job.job_id
    res = subprocess.run([sys.executable, "-c", code, str(record), str(rank)], env=job.env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout))


def live_view_stuck(job: RunningJob, rank: int) -> str:
    """The proc state of *rank*'s stuck report as a live viewer's model gets it (the
    dashboard's path: LiveSource -> JobModel), bounded at 20 s; "" if it never came."""
    code = ("import sys, threading, time\n"
            "from ddptop import auth\n"
            "from ddptop.client.live import LiveSource\n"
            "from ddptop.client.targets import resolve\n"
            "from ddptop.model.job import JobModel\n"
            "model, lock = JobModel(), threading.Lock()\n"
            "def emit(event):\n"
            "    with lock:\n"
            "        model.apply(event)\n"
            "src = LiveSource(resolve(sys.argv[1]), token=auth.load_token())\n"
            "src.start(emit)\n"
            "end, got = time.monotonic() + 20, ''\n"
            "while not got and time.monotonic() < end:\n"
            "    time.sleep(0.2)\n"
            "    with lock:\n"
            "        view = model.ranks.get(int(sys.argv[2]))\n"
            "        got = view.stuck.proc_state if view is not None and view.stuck else ''\n"
            "src.stop()\n"
            "print(got)\n")
    res = subprocess.run([sys.executable, "-c", code, job.job_id, str(rank)], env=job.env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def pending_signals(pid: int) -> int:
    """The signals pending for *pid* (its own and its thread group's), as a bit mask."""
    mask = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            mask |= int(line.split(":", 1)[1], 16)
    return mask


def test_a_rank_asleep_in_c_stays_asleep_while_it_is_named(job_runner: JobRunner) -> None:
    """Looking never changes the job: 30 s in libc sleep() holding the GIL, read from outside
    by default, and sleep() returns 0 (a signal would have woken it early)."""
    env = pyspy_env(True)
    job = job_runner.start("rank_dies", nproc=2, interval=INTERVAL,
                           env={"PROBE_DEATH": "wedge_gil", "PROBE_DIE_RANK": "1", "PROBE_DIE_AT_STEP": "10",
                                "PROBE_WEDGE_S": "30", **env})
    wedged = job.wait_log(r"rank 1: step (\d+): wedged in C holding the GIL at t=([\d.]+)")
    finding, took = wait_unresponsive(job, 1, float(wedged.group(2)))
    assert took <= LIMIT_S, f"named after {took:.2f} s"
    assert "wedge()" in finding["title"] and "via py-spy" in finding["evidence"][0], finding
    assert not any("SIGUSR2" in line and "read with" in line for line in finding["evidence"]), finding
    # Where it is in the user's code, from the outside read (#34 item 2).
    assert any(line.startswith("rank 1 is at probes/rank_dies.py:") and " in wedge (read from outside" in line
               for line in finding["evidence"]), finding["evidence"]
    # The snapshot lists every rank (#34 item 1): the silent one with its status, its last
    # state and its age, and the frame read from outside; still exit 3 (a rank did not answer).
    res = job.run_cli("snapshot", "--json", job.job_id, timeout=60)
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    snap = json.loads(res.stdout)
    ranks = {r["rank"]: r for r in snap["ranks"]}
    assert sorted(ranks) == [0, 1], sorted(ranks)
    silent = ranks[1]
    assert (silent["status"], silent["step"]) == ("stale", int(wedged.group(1))), silent
    assert silent["time"] > 0, silent
    frames = silent["stuck"]["frames"] if silent["stuck"] else []
    assert any(frame[2] == "wedge" for frame in frames), silent["stuck"]
    why = snap["job"]["unreachable"]["1"]
    assert "last state" in why and "in wedge (read from outside" in why, why
    woke = job.wait_log(r"rank 1: step (\d+): unwedged at t=([\d.]+) \(sleep left (\d+) s\)", timeout=90)
    assert woke.group(1) == wedged.group(1)  # the same step: it did nothing but sleep
    assert woke.group(3) == "0", "a signal woke the sleeping rank early"
    assert float(woke.group(2)) - float(wedged.group(2)) >= 29.5


@pytest.mark.parametrize("use_pyspy", [False, pytest.param(True, marks=pytest.mark.long)],
                         ids=["no-pyspy", "pyspy"])
def test_wedged_rank_named_with_its_frame(use_pyspy: bool, job_runner: JobRunner, tmp_path: Path) -> None:
    env = pyspy_env(use_pyspy)
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    job = job_runner.start("rank_dies", nproc=2, interval=INTERVAL,
                           env={"PROBE_DEATH": "wedge_gil", "PROBE_DIE_RANK": "1", "PROBE_DIE_AT_STEP": "10",
                                "PROBE_WEDGE_FIFO": str(fifo), **env})
    silent_at = float(job.wait_log(r"rank 1: step \d+: wedged in C holding the GIL at t=([\d.]+)").group(1))
    try:
        finding, took = wait_unresponsive(job, 1, silent_at)
        asked = asked_for_stacks(job, 1)
    finally:
        fd = os.open(fifo, os.O_RDWR)  # release the wedge whatever happened
        os.write(fd, b"x")
        os.close(fd)
    if use_pyspy:  # py-spy also says who holds the GIL (and, when its --native read finishes
        # within its time bound, the C frame under the Python one: not every time under load)
        assert f"wedge() holding the GIL (rank_dies.py:{WEDGE_LINE})" in finding["title"], finding
    else:
        assert f"main thread in wedge() (rank_dies.py:{WEDGE_LINE})" in finding["title"], finding
    assert ("via py-spy" if use_pyspy else "via faulthandler") in finding["evidence"][0], finding
    said_signal = any("read with SIGUSR2" in line for line in finding["evidence"])
    assert said_signal == (not use_pyspy), finding  # the one path that interrupts the rank says so
    assert took <= LIMIT_S, f"named after {took:.2f} s"
    # The stacks key (LiveSource.request_stacks) gets the outside read for the rank that
    # cannot answer, and the black box recorded it.
    source = "py-spy" if use_pyspy else "faulthandler"
    assert asked == [source, "wedge", WEDGE_LINE], asked
    assert [source, "wedge", WEDGE_LINE] in recorded_outside_stacks(job, 1)
    job.wait_log(r"rank 1: step \d+: unwedged", timeout=60)
    stuck = job.runtime_dir / f"{job.job_id}.1.stuck"
    deadline = time.monotonic() + 30  # answering again removes the report
    while stuck.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not stuck.exists()


# Both in `make test-long`: a stopped rank named "stopped" is walked in `make test` by
# tests/test_agent_e2e.py::test_a_stopped_rank_is_named_through_the_agent.
@pytest.mark.parametrize("use_pyspy", [pytest.param(False, marks=pytest.mark.long),
                                       pytest.param(True, marks=pytest.mark.long)],
                         ids=["no-pyspy", "pyspy"])
def test_stopped_rank_named_stopped(use_pyspy: bool, job_runner: JobRunner) -> None:
    env = pyspy_env(use_pyspy)
    job = job_runner.start("healthy", nproc=2, interval=INTERVAL, env={"PROBE_SECONDS": "90", **env})
    snap = job.wait_ranks(2)
    pid = next(r["pid"] for r in snap["ranks"] if r["rank"] == 1)
    silent_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        finding, took = wait_unresponsive(job, 1, silent_at)
        live = live_view_stuck(job, 1)
        pending = pending_signals(pid)  # what reached it while stopped waits here until SIGCONT
    finally:
        os.kill(pid, signal.SIGCONT)
    assert pending == 0, f"signals reached the stopped rank: mask {pending:#x}"
    assert live.startswith("T"), live
    assert finding["title"].startswith("rank 1 is stopped (SIGSTOP): state T"), finding
    if use_pyspy:  # py-spy reads a stopped process's Python stack too
        assert "main thread in" in finding["title"] and "via py-spy" in finding["evidence"][0], finding
    else:
        assert "via proc" in finding["evidence"][0], finding
    assert took <= LIMIT_S, f"named after {took:.2f} s"
