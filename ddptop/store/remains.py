"""What a dead rank leaves in the runtime directory, and how to read it.

Written by the rank (:mod:`ddptop.reporter.crash`, :mod:`ddptop.reporter.last_words`),
read by the node agent and by viewers on the same host; both sides import this module,
so it depends on the protocol, the store's own modules and the standard library only. Its
bounded reader (:func:`read_bounded`) serves the evidence readers too.

* ``<job>.<rank>.last``: the final :class:`RankState` (msgpack), written at exit, on an
  uncaught exception and on SIGTERM;
* ``<job>.<rank>.crash``: faulthandler's output: every thread's stack on a fatal signal
  ("Fatal Python error: Segmentation fault"), or on SIGTERM (stacks without that line);
* ``<job>.<rank>.stuck``: written by the node agent, not the rank: where a rank that
  stopped answering is stuck (:class:`StuckReport`, msgpack), removed when it answers again;
* ``<job>.<rank>.w<pid>.crash``: the same for a process forked from the rank (a DataLoader
  worker), so that a worker's segfault is never read as the rank's own;
* ``<job>.<rank>.page``: the rank's progress counters, mapped shared while it runs
  (:mod:`ddptop.store.progress_page`): its step, loaders and their lengths at the moment it died.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec

from ddptop.protocol import RankState, StuckReport, WorkerCrash
from ddptop.store import discovery
from ddptop.store.progress_page import PAGE_BYTES, PageFacts, apply_page, read_page

MAX_CRASH_READ = 256 * 1024
MAX_LAST_BYTES = 16 * 1024 * 1024
MAX_STUCK_BYTES = 256 * 1024
STACK_LINES = 24
_WORKER_FILE = re.compile(r"\.w(\d+)\.crash$")
# torch's words when a DataLoader worker dies under a rank (torch/utils/data/_utils/signal_handling.py
# and dataloader.py): the pid(s), and the signal when torch saw one.
WORKER_DEATH = re.compile(r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\)\s*"
                          r"(?:is killed by signal: ([^.]+)|exited unexpectedly)")


def read_bounded(path: str | os.PathLike[str], limit: int, *, tail: bool) -> tuple[bytes, int]:
    """At most *limit* bytes of *path* (its end when *tail*, else its start) and its size;
    never through a link: for a file of a rank's, or an evidence file, that may be large
    (small private files are read whole by :func:`ddptop.store.discovery.private_read`); OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if tail:
            fh.seek(max(0, size - limit))
        return fh.read(limit), size


def read_text_tail(path: Path, limit: int = MAX_CRASH_READ) -> tuple[str, bool]:
    """The last *limit* bytes of *path* as text, and whether it was cut ("" if unreadable)."""
    try:
        data, size = read_bounded(path, limit, tail=True)
    except OSError:
        return "", False
    return data.decode("utf-8", errors="replace"), size > limit


def fatal_error(text: str) -> str | None:
    """The fatal error faulthandler recorded ("Segmentation fault"...), if any."""
    for line in text.splitlines():
        if line.startswith("Fatal Python error:"):
            return line.split(":", 1)[1].strip()
    return None


def crash_signal(path: Path) -> str | None:
    """The fatal error recorded in the crash file at *path*, if any."""
    return fatal_error(read_text_tail(path)[0])


def has_stacks(text: str) -> bool:
    """True if a crash file holds more than its header line (some dump was written)."""
    return len(text.strip().splitlines()) > 1


def current_thread_stack(text: str, limit: int = STACK_LINES) -> list[str]:
    """The frames of the thread that faulted (innermost first), as faulthandler wrote them."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Current thread"):
            frames = [ln.strip() for ln in lines[i + 1:] if ln.startswith("  File ")]
            return frames[:limit]
    return []


def read_last_state(job_id: str, rank: int) -> RankState | None:
    """The rank's last words, if it wrote any."""
    data = discovery.private_read(discovery.rank_file(job_id, rank, "last"), MAX_LAST_BYTES)
    if data is None:
        return None
    try:
        return msgspec.msgpack.decode(data, type=RankState)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def read_final_state(job_id: str, rank: int, pid: int, last_seen: RankState | None) -> RankState | None:
    """All that is known of a rank that just died: its last words or, without them, its last
    sample, with its progress page laid over (the step, loaders and lengths at its death)."""
    state = read_last_state(job_id, rank) or last_seen
    facts = read_progress_page(job_id, rank)
    if state is None or facts is None or facts.pid != pid:
        return state
    return apply_page(state, facts)


def read_progress_page(job_id: str, rank: int) -> PageFacts | None:
    """The rank's progress page, if it left a whole one."""
    data = discovery.private_read(discovery.rank_file(job_id, rank, "page"), PAGE_BYTES)
    return read_page(data) if data is not None else None


def read_stuck(job_id: str, rank: int) -> StuckReport | None:
    """The node agent's report of where *rank* is stuck, if it wrote one (and it decodes)."""
    data = discovery.private_read(discovery.rank_file(job_id, rank, "stuck"), MAX_STUCK_BYTES)
    if data is None:
        return None
    try:
        return msgspec.msgpack.decode(data, type=StuckReport)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def worker_crash_files(job_id: str, rank: int) -> dict[int, Path]:
    """Crash files of processes forked from *rank*, by pid."""
    root = discovery.runtime_dir(create=False)
    out: dict[int, Path] = {}
    for path in root.glob(f"{job_id}.{rank}.w*.crash"):
        match = _WORKER_FILE.search(path.name)
        if match and path.name == f"{job_id}.{rank}.w{match.group(1)}.crash":
            out[int(match.group(1))] = path
    return out


def worker_crashes(job_id: str, rank: int, state: RankState | None) -> list[WorkerCrash]:
    """Workers of *rank* that died of a fatal error, or that torch said died, with their stacks."""
    reason = state.exit_reason if state is not None else ""
    pids = state.loader_worker_pids if state is not None else []
    named: dict[int, str] = {}
    for match in WORKER_DEATH.finditer(reason):
        for pid in re.findall(r"\d+", match.group(1)):
            named[int(pid)] = (match.group(2) or "").strip()
    out: list[WorkerCrash] = []
    files = worker_crash_files(job_id, rank)
    for pid in sorted(set(files) | set(named)):
        text = read_text_tail(files[pid])[0] if pid in files else ""
        fatal = fatal_error(text)
        if fatal is None and pid not in named:
            continue  # a worker that simply ended: nothing to say
        out.append(WorkerCrash(
            pid=pid, worker_id=pids.index(pid) if pid in pids else None,
            signal=named.get(pid) or fatal or "", stack=current_thread_stack(text),
            crash_file=files[pid].name if pid in files else ""))
    return out
