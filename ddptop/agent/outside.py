"""Stacks from outside: where a rank that stopped answering is stuck, read without its help.

A rank wedged in C code that holds the GIL (or SIGSTOPped) cannot run its reporter thread,
so it cannot say where it is. The node agent reads it from outside, and looking never
changes the job: by default nothing reaches the rank, no signal and no ptrace stop.

1. **py-spy** (``py-spy dump --nonblocking --json``: it reads the process's memory with
   process_vm_readv and never pauses it, a stopped rank included), when the executable is
   found beside ``sys.executable`` or on PATH and ``DDPTOP_PYSPY`` is not ``0``;
2. **/proc**: the process state ("T (stopped)"), wchan and the main thread's syscall.

Only where the user allows it (``ddptop launch --stacks-signal``, ``DDPTOP_STACKS_SIGNAL=1``)
a read may interrupt the rank: py-spy ``--native`` (which pauses it a moment) for the C
frames, and, when py-spy cannot read it, the **faulthandler** signal (``SIGUSR2``, registered
by the reporter, ``reporter/crash.py``): it dumps every thread from C, but wakes a sleep or
poll in C early (a call that does not retry on EINTR fails). The report says so whenever
that was done.

Every step is bounded in time; :class:`OutsideReader` runs them on one worker thread and
reads each rank at most once per ``EVERY_S`` while it stays silent.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ddptop.protocol import FrameStack, StuckReport
from ddptop.status import SAMPLE_INTERVAL_S, silent_after_s
from ddptop.store.remains import read_text_tail

log = logging.getLogger(__name__)

PYSPY_ENV = "DDPTOP_PYSPY"  # "0": never use py-spy; a path: that executable
SIGNAL_ENV = "DDPTOP_STACKS_SIGNAL"  # "1": reads may interrupt the rank (SIGUSR2, py-spy --native)
PYSPY_TIMEOUT_S = 3.0
SIGNAL_WAIT_S = 1.0
EVERY_S = 5.0  # at most one outside read per rank this often while it stays silent
MAX_FRAMES = 40
MAX_NATIVE = 12
DUMP_SIGNAL = signal.SIGUSR2  # the reporter's (ddptop.reporter.crash.DUMP_SIGNAL)
_FH_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def pyspy_path() -> str | None:
    """The py-spy executable to use, or None (absent, or switched off with DDPTOP_PYSPY=0)."""
    wanted = os.environ.get(PYSPY_ENV, "")
    if wanted == "0":
        return None
    if wanted and os.access(wanted, os.X_OK):
        return wanted
    beside = Path(sys.executable).with_name("py-spy")  # the venv's bin, not always on PATH
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def signals_allowed() -> bool:
    """True where the user allowed reads that interrupt a rank (``--stacks-signal``)."""
    return os.environ.get(SIGNAL_ENV, "") not in ("", "0")


def proc_facts(pid: int) -> tuple[str, str, str, bool]:
    """(State, wchan, syscall, SIGUSR2 caught) of *pid* from /proc ("" where unreadable)."""
    state, caught = "", False
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                state = line.split(":", 1)[1].strip()
            elif line.startswith("SigCgt:"):
                caught = bool(int(line.split(":", 1)[1], 16) >> (DUMP_SIGNAL - 1) & 1)
    except (OSError, ValueError):
        pass
    return state, _read(f"/proc/{pid}/wchan"), _read(f"/proc/{pid}/syscall"), caught


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()[:200]
    except OSError:
        return ""  # syscall needs ptrace rights: unreadable in some containers


def read_pyspy(exe: str, pid: int, native: bool) -> tuple[list[FrameStack], list[str], bool | None]:
    """The main thread's Python frames (innermost last), native frames, and GIL ownership.

    Raises OSError/ValueError/subprocess errors when py-spy cannot read the process.
    """
    res = subprocess.run([exe, "dump", "--pid", str(pid), "--nonblocking", "--json"], capture_output=True,
                         text=True, timeout=PYSPY_TIMEOUT_S, check=False)
    if res.returncode != 0:
        raise ValueError((res.stderr or res.stdout).strip().splitlines()[-1:] or ["py-spy failed"])
    threads = json.loads(res.stdout)
    main = next((t for t in threads if t.get("os_thread_id") == pid), threads[0] if threads else None)
    if main is None:
        raise ValueError("py-spy saw no thread")
    frames = [FrameStack(file=str(f.get("filename", "")), line=int(f.get("line") or 0),
                         function=str(f.get("name", ""))) for f in main.get("frames", [])[:MAX_FRAMES]]
    frames.reverse()  # py-spy lists innermost first; FrameStack lists are innermost last
    return frames, _pyspy_native(exe, pid) if native else [], main.get("owns_gil")


def _pyspy_native(exe: str, pid: int) -> list[str]:
    # --native pauses the process (not allowed with --nonblocking); worth it only for C frames.
    try:
        res = subprocess.run([exe, "dump", "--pid", str(pid), "--native"], capture_output=True, text=True,
                             timeout=PYSPY_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    out: list[str] = []
    inside = False
    for line in res.stdout.splitlines():
        if line.startswith("Thread "):
            inside = line.split()[1] == str(pid)
        elif inside and line.startswith("    ") and not line.startswith("        "):
            out.append(line.strip())
    return out[:MAX_NATIVE]


def read_faulthandler(pid: int, crash_file: Path, wait_s: float = SIGNAL_WAIT_S) -> list[FrameStack]:
    """Send the dump signal; the main thread's frames from the new tail of *crash_file*."""
    before = crash_file.stat().st_size
    os.kill(pid, DUMP_SIGNAL)
    deadline, size, settled = time.monotonic() + wait_s, before, 0
    while time.monotonic() < deadline and settled < 2:
        time.sleep(0.05)
        now = crash_file.stat().st_size
        settled = settled + 1 if now == size and now > before else 0
        size = now
    text, _cut = read_text_tail(crash_file, max(0, size - before))
    return main_thread_frames(text)


def main_thread_frames(text: str) -> list[FrameStack]:
    """The main thread's frames in a faulthandler dump, innermost last.

    faulthandler names threads by address only; the main thread is the one whose outermost
    frame is ``<module>`` (other threads start in ``threading``'s bootstrap).
    """
    threads: list[list[FrameStack]] = []
    for line in text.splitlines():
        if _FH_THREAD.match(line):
            threads.append([])
            continue
        frame = _FH_FRAME.match(line)
        if frame and threads:
            threads[-1].append(FrameStack(file=frame.group(1), line=int(frame.group(2)),
                                          function=frame.group(3).strip()))
    for frames in threads:
        if frames and frames[-1].function == "<module>":
            return list(reversed(frames))[-MAX_FRAMES:]
    return list(reversed(threads[0]))[-MAX_FRAMES:] if threads else []


def capture(rank: int, pid: int, since: float, crash_file: Path) -> StuckReport:
    """Where *pid* is stuck, by the best method that works here (bounded: a few seconds)."""
    state, wchan, syscall, caught = proc_facts(pid)
    report = StuckReport(rank=rank, pid=pid, time=time.time(), since=since, source="proc",
                         proc_state=state, wchan=wchan, syscall=syscall)
    stopped = state.startswith(("T", "t"))
    notes: list[str] = []
    allowed = signals_allowed()
    exe = pyspy_path()
    if exe is not None:
        try:
            # --native pauses the rank: only where the user allowed it, never a stopped one.
            native = allowed and not stopped
            report.frames, report.native, report.holds_gil = read_pyspy(exe, pid, native=native)
            report.source = "py-spy"
            if report.native:
                notes.append("py-spy --native paused the rank a moment for its C frames (--stacks-signal)")
        except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError) as exc:
            notes.append(f"py-spy: {exc}")
    else:
        notes.append("py-spy: not installed" if os.environ.get(PYSPY_ENV) != "0" else "py-spy: off")
    if report.source == "proc" and not stopped and allowed:
        if caught and crash_file.exists():
            try:
                report.frames = read_faulthandler(pid, crash_file)
                report.source = "faulthandler" if report.frames else "proc"
                notes.append("read with SIGUSR2 (faulthandler, --stacks-signal): a sleep or poll in C "
                             "was interrupted" + ("" if report.frames else "; no dump within the wait"))
            except OSError as exc:
                notes.append(f"faulthandler: {exc}")
        else:
            notes.append("faulthandler: the rank has no dump handler")
    elif report.source == "proc" and not stopped:
        notes.append("no signal sent: --stacks-signal allows faulthandler's SIGUSR2 (it interrupts the rank)")
    report.note = "; ".join(notes)[:500]
    report.time = time.time()
    return report


class Silence:
    """When each rank's state last arrived, and which ranks have been silent too long.

    The threshold is :func:`ddptop.status.silent_after_s` of the rank's interval (two missed
    samples and a grace: the one rule of silence, shared with the viewer); the interval is not on
    the wire, so it is learnt from the gaps between arrivals (their median, robust to a
    burst after a slow moment).
    """

    def __init__(self) -> None:
        self._heard: dict[int, float] = {}
        self._gaps: dict[int, list[float]] = {}

    def heard(self, rank: int, at: float) -> None:
        """A state of *rank* arrived at wall clock *at*."""
        last = self._heard.get(rank)
        if last is not None and at > last:
            gaps = self._gaps.setdefault(rank, [])
            gaps.append(at - last)
            del gaps[:-5]
        self._heard[rank] = at

    def forget(self, rank: int) -> None:
        """The rank ended (or restarted): stop judging it."""
        self._heard.pop(rank, None)
        self._gaps.pop(rank, None)

    def threshold(self, rank: int) -> float:
        """Seconds of silence after which *rank* counts as not answering."""
        gaps = sorted(self._gaps.get(rank, []))
        return silent_after_s(gaps[len(gaps) // 2] if gaps else SAMPLE_INTERVAL_S)

    def silent(self, now: float) -> list[tuple[int, float]]:
        """(rank, last heard) of every rank silent for longer than its threshold."""
        return [(r, t) for r, t in self._heard.items() if now - t > self.threshold(r)]


class OutsideReader:
    """Reads silent ranks from outside on one worker thread, at most once per rank per EVERY_S."""

    def __init__(self, done: Callable[[StuckReport], None], every_s: float = EVERY_S) -> None:
        self._done = done
        self._every_s = every_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ddptop-outside")
        self._lock = threading.Lock()
        self._last: dict[int, float] = {}  # rank -> monotonic time of its last read
        self._busy: set[int] = set()

    def request(self, rank: int, pid: int, since: float, crash_file: Path) -> bool:
        """Read *rank* unless it was read recently or is being read (never blocks)."""
        now = time.monotonic()
        with self._lock:
            if rank in self._busy or now - self._last.get(rank, -1e9) < self._every_s:
                return False
            self._busy.add(rank)
            self._last[rank] = now
        self._pool.submit(self._one, rank, pid, since, crash_file)
        return True

    def answered(self, rank: int) -> None:
        """The rank answers again: a next silence is read at once."""
        with self._lock:
            self._last.pop(rank, None)

    def _one(self, rank: int, pid: int, since: float, crash_file: Path) -> None:
        try:
            self._done(capture(rank, pid, since, crash_file))
        except Exception as exc:  # a process that vanished mid-read: nothing to report
            log.debug("reading rank %d from outside failed: %s", rank, exc)
        finally:
            with self._lock:
                self._busy.discard(rank)

    def close(self) -> None:
        """Stop (a read in flight ends on its own timeouts)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
