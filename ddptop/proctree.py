"""Stopping a launched job for good: its process group *and* every descendant.

``torchrun`` starts each rank in a session of its own, so killing the launcher's process
group leaves the ranks running: after SIGKILL of torchrun, or while a rank is hung in a
destructor, they become orphans that hold ports and CPU. Whoever started a job (``ddptop
demo``, the tests, the benchmarks) stops it here: descendants are collected *before* the
group is signalled (an orphan can no longer be found from its parent), then TERM, a
grace period, and KILL to the group and to each collected descendant still alive.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from typing import Any

import psutil

log = logging.getLogger(__name__)


def descendants(pid: int) -> list[psutil.Process]:
    """Every live descendant of *pid* (empty when *pid* is gone)."""
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_tree(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """Stop *proc* (started with ``start_new_session=True``) and all it started; reaps *proc*.

    SIGTERM first (torchrun forwards it to the ranks, which leave their last words),
    SIGKILL after *grace_s* to the group and to every descendant seen along the way.
    Idempotent, and a no-op once *proc* was reaped (its pid may have been reused); never
    raises for processes that are already gone.
    """
    if proc.poll() is not None:
        # Already reaped: its pid (and process group id) may belong to someone else now.
        return
    seen: dict[int, psutil.Process] = {p.pid: p for p in descendants(proc.pid)}
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        seen.update({p.pid: p for p in descendants(proc.pid)})
        _signal_group(proc.pid, signal.SIGKILL)
        proc.kill()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:  # stuck in the kernel (a GPU driver): move on
            log.warning("pid %d did not die after SIGKILL", proc.pid)
    # Stragglers left in the launcher's group: the group id is still ours, as the group
    # leader was alive a moment ago and a group's id is not reused while it has members.
    _signal_group(proc.pid, signal.SIGKILL)
    alive = [p for p in seen.values() if _running(p)]
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for p in still:
        log.debug("killing leftover pid %d (%s)", p.pid, _name(p))
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(still, timeout=grace_s)


def _running(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _name(p: psutil.Process) -> str:
    try:
        return str(p.name())
    except psutil.Error:
        return "?"
