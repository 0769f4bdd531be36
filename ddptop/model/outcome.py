"""How each rank ended, and which of them failed first (pure; no clock needed).

When one rank fails, torchrun sends every other rank SIGTERM (and SIGKILL 30 s later):
those ranks are *victims*. A post-mortem must name the first failure and show the victims
as torn down, never as crashes. The inputs are the node agent's ``RankExit`` (exit code
or signal, seen from outside), the rank's own last words (its final ``RankState``) and,
for ranks that vanished without either, the time their connection was lost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ddptop.protocol import RankExit, RankState
from ddptop.status import FINAL, Status

# What a launcher or a person sends to stop a process: a death by one of these after
# another rank failed is a teardown.
TEARDOWN_SIGNALS = frozenset(("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP"))
# Errors a rank raises only because a peer is gone (gloo, NCCL, the TCPStore): after another
# rank's failure they mark a victim as surely as the launcher's SIGTERM does.
# Horovod's shutdown says itself that it follows another rank's exception (#54).
PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited"
                       r"|socket was closed|failed to recv|Connection refused|ncclRemoteError"
                       r"|Horovod has been shut down|caused by an exception on one of the ranks",
                       re.IGNORECASE)


@dataclass(frozen=True)
class Ending:
    """One rank's end as far as it is known."""

    rank: int
    time: float
    failed: bool  # anything but a clean exit with code 0
    stopped: bool  # ended by a stop signal, or failed because a peer was gone: maybe a victim
    status: str  # the status word before job context (never torn_down)
    peer_gone: bool = False  # failed because a peer was gone: surely after another rank


def ending_of(rank: int, exit: RankExit | None, state: RankState | None,
              lost_at: float | None) -> Ending | None:
    """The end of one rank from what is known of it, or None if it has not ended."""
    said = state.status if state is not None and state.status in FINAL else ""
    if exit is None and not said and lost_at is None:
        return None  # a running rank: the usual case, thousands of times per redraw
    peer_gone = state is not None and bool(PEER_GONE.search(state.exit_reason))
    if exit is not None:
        signal = exit.signal or ("SIGTERM" if said == Status.TERMINATED else "")
        if exit.exit_code == 0 or (exit.exit_code is None and not signal and said == Status.EXITED):
            return Ending(rank, exit.time, failed=False, stopped=False, status=Status.EXITED)
        stopped = signal in TEARDOWN_SIGNALS or peer_gone
        status = Status.TERMINATED if signal in ("SIGTERM", "SIGINT", "SIGHUP") else Status.CRASHED
        if exit.exit_code is None and not signal and not said:
            status = Status.LOST  # gone, reaped before its status could be read, no last words
        return Ending(rank, exit.time, failed=True, stopped=stopped, status=status, peer_gone=peer_gone)
    if said:
        assert state is not None
        return Ending(rank, state.time, failed=said != Status.EXITED,
                      stopped=said == Status.TERMINATED or peer_gone, status=said, peer_gone=peer_gone)
    if lost_at is not None:
        return Ending(rank, lost_at, failed=True, stopped=False, status=Status.LOST)
    return None


def first_failure(endings: Iterable[Ending]) -> Ending | None:
    """The rank that failed first: the earliest failure not caused by a stop signal, else the
    earliest failure to a signal (a rank SIGKILLed from outside is the first cause of a
    teardown), else the earliest at all. A rank that failed because a peer was gone comes
    after that peer whatever the clocks say: its exit is seen by another host's agent, and
    the agents see exits a poll apart."""
    failed = sorted((e for e in endings if e.failed), key=lambda e: (e.time, e.rank))
    own = [e for e in failed if not e.stopped]
    if own:
        return own[0]
    signalled = [e for e in failed if not e.peer_gone]
    if signalled:
        return signalled[0]
    return failed[0] if failed else None


# Exits the node agent sees in one poll carry its clock at that poll, in no particular order
# (a loaded machine delays the poll): a stop signal this close to a crash followed it.
SAME_MOMENT_S = 1.0


def resolved_status(ending: Ending, first: Ending | None) -> str:
    """The status word with job context: stopped (or failed for want of a peer) after another
    rank's failure = torn down: a victim of the teardown, not a cause."""
    skew = SAME_MOMENT_S if first is not None and not first.stopped else 0.0
    after = ending.time >= first.time - skew or (ending.peer_gone and not first.peer_gone) if first else False
    if first is not None and ending.stopped and ending.rank != first.rank and after:
        return Status.TORN_DOWN
    return ending.status


def exit_fields(exit: RankExit | None, own_code: int | None = None) -> dict[str, object]:
    """The RankState fields that carry an agent's RankExit (for msgspec.structs.replace). Where
    the agent could not read the status (an older kernel, reaped first), the rank's own word
    stands: *own_code*, the status its last words give (``sys.exit``'s)."""
    if exit is None:
        return {}
    code = exit.exit_code if exit.exit_code is not None or exit.signal else own_code
    return {"exit_code": code, "exit_signal": exit.signal, "exited_at": exit.time,
            "exit_cause": exit.cause, "memory_limit_bytes": exit.memory_limit_bytes,
            "memory_peak_bytes": exit.memory_peak_bytes}
