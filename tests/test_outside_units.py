"""Units of stacks from outside: faulthandler parsing, silence thresholds, /proc capture, the rule.

Real parts: faulthandler's own output from a real process, a real SIGSTOPped process,
the real JobModel fold and the real diagnosis engine.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddptop.agent.outside import Silence, capture, main_thread_frames
from ddptop.diagnosis import diagnose
from ddptop.model.job import JobModel
from ddptop.protocol import FrameStack, RankState, StacksMsg, StateMsg, StuckReport, ThreadStack

DUMPER = """
import faulthandler, sys, threading
ready = threading.Event()
def idle():
    ready.set()
    threading.Event().wait(30)
def inner(path):
    with open(path, "w") as fh:
        faulthandler.dump_traceback(fh, all_threads=True)
threading.Thread(target=idle, daemon=True).start()
ready.wait(10)
inner(sys.argv[1])
"""


def test_main_thread_frames_from_a_real_faulthandler_dump(tmp_path: Path) -> None:
    out = tmp_path / "dump.txt"
    script = tmp_path / "dumper.py"
    script.write_text(DUMPER)
    subprocess.run([sys.executable, str(script), str(out)], check=True, timeout=60)
    frames = main_thread_frames(out.read_text())
    assert [f.function for f in frames] == ["<module>", "inner"], out.read_text()
    assert frames[-1].file == str(script) and frames[-1].line == 9


def test_silence_learns_the_interval() -> None:
    silence = Silence()
    for i in range(6):
        silence.heard(3, 100.0 + 0.25 * i)
    assert silence.threshold(3) == pytest.approx(1.5)
    assert silence.silent(101.25 + 1.4) == [] and silence.silent(101.25 + 1.6) == [(3, 101.25)]
    silence.forget(3)
    assert silence.silent(1000.0) == []


def test_capture_of_a_stopped_process_without_pyspy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DDPTOP_PYSPY", "0")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        report = capture(1, child.pid, 5.0, tmp_path / "none.crash")
        while not report.proc_state.startswith("T") and time.monotonic() < deadline:
            time.sleep(0.05)  # the stop is asynchronous
            report = capture(1, child.pid, 5.0, tmp_path / "none.crash")
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait(timeout=10)
    assert (report.source, report.proc_state[:1], report.frames) == ("proc", "T", []), report
    assert "py-spy: off" in report.note


def test_rule_names_the_stuck_rank_until_it_answers() -> None:
    model = JobModel(job_id="j", world_size=2)
    for rank in (0, 1):
        model.apply(StateMsg(state=RankState(rank=rank, local_rank=rank, world_size=2, host="h",
                                             pid=10 + rank, job_id="j", time=100.0, step=7)))
    stuck = StuckReport(rank=1, pid=11, time=103.0, since=100.0, source="faulthandler",
                        proc_state="S (sleeping)",
                        frames=[FrameStack(file="/x/train.py", line=5, function="main"),
                                FrameStack(file="/x/train.py", line=88, function="spin")])
    main = ThreadStack(thread_id=11, name="MainThread", frames=stuck.frames, is_main=True)
    model.apply(StacksMsg(rank=1, time=103.0, threads=[main], source="faulthandler", stuck=stuck), 1, 103.0)
    found = [f for f in diagnose(model.snapshot(112.0), {}, 112.0) if f.kind == "rank_unresponsive"]
    assert len(found) == 1 and found[0].ranks == [1] and found[0].severity == "critical", found
    title = found[0].title
    assert title == "rank 1 has not answered for 12.0s; main thread in spin() (train.py:88)", title
    assert found[0].since == 100.0
    model.apply(StateMsg(state=RankState(rank=1, local_rank=1, world_size=2, host="h", pid=11, job_id="j",
                                         time=113.0, step=8)))
    assert not [f for f in diagnose(model.snapshot(113.5), {}, 113.5) if f.kind == "rank_unresponsive"]
