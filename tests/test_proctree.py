"""stop_tree: a launcher's group *and* children in sessions of their own (like torchrun's ranks)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from ddptop.proctree import descendants, stop_tree

# A launcher that starts a "rank" in a new session (as torchrun does), reports its pid, and
# optionally ignores SIGTERM (as a launcher that is stuck would). The rank ignores SIGTERM too.
_LAUNCHER = r"""
import signal, subprocess, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"],
    start_new_session=True)
print(rank.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("mode", ["polite", "stubborn"])
def test_stop_tree_reaps_children_in_their_own_session(mode: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, mode], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    rank_pid = 0
    try:
        assert proc.stdout is not None
        rank_pid = int(proc.stdout.readline())
        rank = psutil.Process(rank_pid)
        assert rank.pid in {p.pid for p in descendants(proc.pid)}
        assert rank_pid != proc.pid and rank.is_running()
        began = time.monotonic()
        stop_tree(proc, grace_s=1.0)
        assert time.monotonic() - began < 10
        assert proc.poll() is not None
        assert not rank.is_running() or rank.status() == psutil.STATUS_ZOMBIE
    finally:
        if proc.poll() is None:
            proc.kill()
        if rank_pid and psutil.pid_exists(rank_pid):
            psutil.Process(rank_pid).kill()
        if proc.stdout is not None:
            proc.stdout.close()


def test_stop_tree_on_a_finished_process_is_a_no_op() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait(timeout=30)
    stop_tree(proc, grace_s=0.5)
    stop_tree(proc, grace_s=0.5)
    assert proc.returncode == 0
