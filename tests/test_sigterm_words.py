"""SIGTERM's last words never change how a rank dies (#22, found under SLURM).

The stacks on SIGTERM used to be dumped by faulthandler from the signal handler, without
the GIL, walking the frames of threads that ran Python at that moment: ranks with busy
threads died of SIGSEGV instead of SIGTERM (this test on the code before the fix: 10 of 40
runs, and 3 failed runs of 3; by hand: 1 in 20 to 1 in 30). Real processes: each one's
reporter is started by ``ddptop.install()`` with RANK set, busy threads run psutil and
Python, and SIGTERM comes once or twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHILD = r'''
import threading
import ddptop
assert ddptop.install()
import psutil

def busy():
    p = psutil.Process()
    while True:
        p.memory_info(); p.cpu_times(); p.num_threads()

for _ in range(3):
    threading.Thread(target=busy, daemon=True).start()
print("ready", flush=True)
while True:
    sum(i * i for i in range(1000))
'''
RUNS = 40


def test_sigterm_with_busy_threads_always_ends_the_rank_by_sigterm_with_its_stacks(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "DDPTOP_RUNTIME_DIR": str(rt),
           "DDPTOP_RECORD_MB": "0"}
    codes: list[int] = []
    for run in range(RUNS):
        env["DDPTOP_JOB_ID"] = f"term{run}"
        proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            proc.send_signal(signal.SIGTERM)
            if run % 2:  # SLURM's step signal and torchrun's own, a moment apart
                proc.send_signal(signal.SIGTERM)
            codes.append(proc.wait(timeout=30))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    assert codes == [-signal.SIGTERM] * RUNS, {c: codes.count(c) for c in set(codes)}
    crash = (rt / "term0.0.crash").read_text()
    assert "Current thread" in crash or "Thread 0x" in crash, crash[:2000]
    assert "<string>" in crash  # the main thread's frame (the script) is in the dump
    assert "Fatal Python error" not in crash
