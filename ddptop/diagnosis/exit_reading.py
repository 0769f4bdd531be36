"""How a rank ended, read for what it usually means, where only a log tells it (#46).

A live job's node agent sees each rank's exit as it happens, on one clock. A console log
posted after the fact holds far less: an exit status, maybe a traceback, rarely a time,
and the lines in the order the launcher happened to print them. Read for what they
usually mean:

* **SIGABRT (-6)** after a timeout is NCCL's watchdog taking the rank down: a victim as
  often as a cause (and torchrun prints the lowest local rank, not the first to fail);
* **SIGKILL (-9)** without a traceback: the kernel's OOM killer or a kill from outside,
  which picks a process by its memory, not by its fault; named only where the log shows
  no other process at all (a one-process job's rank 0);
* **SIGSEGV, SIGBUS, SIGILL, SIGFPE**: the crash itself, of that rank;
* **an exit code with a traceback**: the traceback's own exception; one raised inside a
  collective or because a peer went (a timeout, ``ncclRemoteError``, an NCCL call that
  failed such as horovod's ``ncclCommInitRank failed``, the monitored barrier's report) is a
  victim's, or the communicator's; **an exit code alone** says nothing of why.

The order of lines in a file is never a verdict by itself: where several ranks failed and
the log gives no times that tell them apart, which failed first is not told. And a step, host
or pid the log does not hold is left out of what is said (:func:`where_known`,
:func:`known_step`), never printed as 0 or "?". Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddptop.model.outcome import PEER_GONE
from ddptop.protocol import STUB_LOCAL_RANK, RankState, Sample

CRASH_SIGNALS = frozenset(("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"))
_OWN_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]{0,120}(?:Error|Exception|Interrupt|Exit)\b:?.{0,2000}"
                            r"|ERROR: Unexpected bus error encountered in worker.{0,400})$", re.MULTILINE)
# Words of an error a rank raises because of the collective or a peer, not of its own making.
_COLLECTIVE = re.compile(r"Watchdog caught|Timeout at NCCL work|timed out|DistBackendError|NCCL error|"
                         r"ncclRemoteError|ncclInternalError|ncclSystemError|monitoredBarrier|"
                         r"\bnccl[A-Z]\w{2,40} failed|"  # an NCCL call's failure (horovod's ncclCommInitRank)
                         r"Detected mismatch between collectives|ProcessGroup|c10d|HorovodInternalError",
                         re.IGNORECASE)
# Frames of a traceback whose last words were cut: the call it stopped in tells as much.
_IN_COLLECTIVE = re.compile(r"\b(?:barrier|all_reduce|all_gather\w*|broadcast\w*|reduce_scatter\w*|"
                            r"all_to_all\w*|_verify_params_across_processes|monitored_barrier|wait)\(")


@dataclass(frozen=True)
class ExitReading:
    """What a rank's end, as a log tells it, proves of it."""

    certain: bool  # the rank's end is its own failure, not a victim's
    words: str  # the reading, said in the finding


def told_by_log(state: RankState, histories: dict[int, list[Sample]]) -> bool:
    """True where all that is known of *state* is what a console log or error file said: a
    stub (no reporter spoke), no Flight Recorder groups, no samples of progress."""
    return (state.local_rank == STUB_LOCAL_RANK and not state.collectives
            and not any(s.step or s.seq for s in histories.get(state.rank, [])))


def read_exit(state: RankState, alone: bool) -> ExitReading:
    """*state*'s end as its exit status and words usually mean it; *alone*: the log shows no
    other process than this rank, rank 0 (a one-process job)."""
    sig, reason = state.exit_signal, state.exit_reason
    if sig in CRASH_SIGNALS:
        return ExitReading(True, f"{sig} is the crash itself, of this rank")
    if sig == "SIGABRT":
        return ExitReading(False, "SIGABRT (-6) is how NCCL's watchdog ends a rank after a collective failed "
                                  "or timed out: a victim as often as a cause (torchrun names the lowest "
                                  "local rank, not the first to fail)")
    if sig == "SIGKILL":
        if alone:
            return ExitReading(True, "SIGKILL (-9), and the log shows no other process: the job's only rank")
        return ExitReading(False, "SIGKILL (-9) without a traceback: the kernel's OOM killer or a kill from "
                                  "outside, which picks a process by its memory, not by its fault")
    if sig:
        return ExitReading(False, f"{sig}: stopped from outside")
    if PEER_GONE.search(reason) or _COLLECTIVE.search(reason):
        return ExitReading(False, "its error was raised inside a collective or because a peer went: a "
                                  "victim's words")
    if _OWN_EXCEPTION.search(reason):
        return ExitReading(True, "its own exception")
    if _IN_COLLECTIVE.search(reason):
        return ExitReading(False, "its traceback stops inside a collective call, its exception's line is not "
                                  "in the log")
    return ExitReading(False, "an exit status without its exception's words: why is not in the log")


def where_known(s: RankState) -> str:
    """" on HOST (pid P)", of what is known: a field the evidence does not hold is left out."""
    return (f" on {s.host}" if s.host else "") + (f" (pid {s.pid})" if s.pid else "")


def known_step(s: RankState, histories: dict[int, list[Sample]]) -> int | None:
    """The rank's last step, where the evidence holds one (a log alone does not): else None."""
    known = s.step or any(h.step for h in histories.get(s.rank, [])) or not told_by_log(s, histories)
    return max([s.step] + [h.step for h in histories.get(s.rank, [])]) if known else None


def at_step(s: RankState, histories: dict[int, list[Sample]], words: str) -> str:
    """*words* and the rank's last step, where the evidence holds one; else nothing."""
    step = known_step(s, histories)
    return f"{words}{step}" if step is not None else ""
