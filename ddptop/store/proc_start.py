"""A process's start, to tell the rank that wrote a discovery entry from a later one with its pid.

A pid names a process only while it lives: containers number their processes from 1 again
at every start, and a busy node wraps ``pid_max``. An entry whose pid is alive may therefore
be the record of an ended rank, and a viewer that believed it would show a stranger as a
rank (#49). The kernel gives every process its start in clock ticks since boot (field 22 of
``/proc/PID/stat``); a rank writes its own into its entry (``Endpoint.proc_start``), and the
entry stands for a live rank only while the process with its pid started at that very tick.

Entries written before #49 lack it: for them, a process that started after the entry's
``start_time`` (the reporter's wall clock at start, with :data:`WALL_SLACK_S` for the
boot-time clock's rounding) is not the one that wrote it. Standard library only: the rank
side imports this. Reads of ``/proc`` only; never a signal.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

PROC = Path("/proc")
# /proc/stat's btime is whole seconds and the wall clock drifts from the boot clock (NTP):
# a process's wall start computed from ticks is off by up to a few seconds.
WALL_SLACK_S = 5.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def start_ticks(pid: int | str) -> int:
    """When process *pid* started, in clock ticks since boot (0 when unknown: gone, not Linux)."""
    try:
        with open(PROC / str(pid) / "stat", "rb") as fh:
            data = fh.read(4096)
    except OSError:
        return 0
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last.
    tail = data[data.rfind(b")") + 2:].split()
    try:
        return int(tail[19])  # field 22; the tail starts at field 3
    except (IndexError, ValueError):
        return 0


def own_start_ticks() -> int:
    """This process's start in clock ticks since boot (0 when unknown)."""
    return start_ticks("self")


@functools.cache  # the boot time does not change while a process lives: /proc/stat read once
def _boot_time() -> float:
    try:
        with open(PROC / "stat", "rb") as fh:
            for line in fh.read(1 << 16).splitlines():
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def wall_start(pid: int | str) -> float:
    """Process *pid*'s start as wall-clock seconds (0.0 when unknown)."""
    ticks, boot = start_ticks(pid), _boot_time()
    return boot + ticks / _CLK_TCK if ticks and boot else 0.0


def same_process(pid: int | str, proc_start: int, written_at: float) -> bool:
    """True unless the live process *pid* is known not to be the one that wrote an entry:
    *proc_start* (its start in ticks, 0 when the entry has none) differs, or, without it, the
    process started after *written_at* (wall clock; 0.0 when unknown). Unknown means yes:
    without ``/proc`` the pid is all there is to go by."""
    if proc_start:
        now = start_ticks(pid)
        return not now or now == proc_start
    if written_at:
        started = wall_start(pid)
        return not started or started <= written_at + WALL_SLACK_S
    return True
