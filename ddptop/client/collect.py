"""What a viewer reads of ranks that cannot answer, and how it sums up those that did not.

A dead rank's last words and crash file, a closing rank's end, a silent rank's stack as its
node agent read it from outside (all from the runtime directory, through
:mod:`ddptop.store.remains`), as events a live source delivers like any other; and the
one-line summaries of ranks that did not answer (refused, silent, a whole host down).
"""

from __future__ import annotations

import time

from ddptop.client.handshake import TOKEN_MISSING, TOKEN_REFUSED
from ddptop.client.targets import JobTarget
from ddptop.protocol import (
    STUB_LOCAL_RANK,
    ConnectionEvent,
    RankState,
    RecordEntry,
    StacksMsg,
    StateMsg,
)
from ddptop.status import FINAL, Status
from ddptop.store import discovery
from ddptop.store.discovery import Endpoint
from ddptop.store.progress_page import apply_page
from ddptop.store.remains import crash_signal, read_last_state, read_progress_page, read_stuck
from ddptop.textfmt import rank_ranges

LAST_WORDS_WAIT_S = 3.0  # a closed rank whose process lives: how long its last words may take
GONE_GRACE_S = 1.0  # the same for a rank whose process is already gone
GONE = "process gone"  # why a rank found dead before the viewer connected is lost


def last_words(endpoint: Endpoint) -> RankState:
    """What a dead rank left behind: its final state, or a stub naming the loss."""
    # The one capped, link-refusing reader of last words (a symlink planted in the runtime
    # directory is never followed).
    state = read_last_state(endpoint.job_id, endpoint.rank)
    if state is None:
        state = RankState(rank=endpoint.rank, local_rank=STUB_LOCAL_RANK, world_size=endpoint.world_size,
                          host=endpoint.node or endpoint.host, pid=endpoint.pid,
                          job_id=endpoint.job_id, status=Status.LOST, time=time.time())
        page = read_progress_page(endpoint.job_id, endpoint.rank)
        if page is not None:  # no last words: its step and loaders at its death, from its page
            state = apply_page(state, page)
    crash = discovery.rank_file(endpoint.job_id, endpoint.rank, "crash")
    fatal = crash_signal(crash)
    if fatal:
        state.status = Status.CRASHED
        state.exit_reason = state.exit_reason or fatal
        state.crash_file = str(crash)
    elif state.status == Status.RUNNING:
        state.status = Status.LOST
    return state


def ended_before(target: JobTarget, now: float) -> list[RecordEntry | ConnectionEvent]:
    """What a viewer knows at once of the ranks of *target* it cannot connect to: the dead
    ones' last words, and which ranks have no discovery entry at all."""
    out: list[RecordEntry | ConnectionEvent] = []
    for endpoint in target.dead:
        out.append(RecordEntry(time=now, rank=endpoint.rank, message=StateMsg(state=last_words(endpoint))))
        out.append(ConnectionEvent(time=now, rank=endpoint.rank, status=Status.LOST, reason=GONE))
    out.extend(ConnectionEvent(time=now, rank=rank, status=Status.LOST, reason="no discovery entry")
               for rank in target.missing_ranks)
    return out


def end_after_close(endpoint: Endpoint, reason: str, waited: float,
                    now: float) -> list[RecordEntry | ConnectionEvent] | None:
    """How a rank whose connection closed *waited* seconds ago ended: its last words as soon
    as they are there, else "lost" once its process is gone or the wait ran out; None while
    it is worth waiting (a closing rank is on its way out, its words may come a moment later)."""
    state = last_words(endpoint)
    alive = discovery.entry_alive(endpoint)
    # A gone process gets a short grace too: its words may still be on their way to disk
    # while the viewer already saw the socket close.
    if state.status not in FINAL and waited < (LAST_WORDS_WAIT_S if alive else GONE_GRACE_S):
        return None
    if state.status in FINAL:
        words = RecordEntry(time=now, rank=endpoint.rank, message=StateMsg(state=state))
        return [words, ConnectionEvent(time=now, rank=endpoint.rank, status=Status.LOST, reason=reason)]
    process = "still runs" if alive else "is gone"
    why = f"{reason}; no last words after {waited:.1f} s, its process {process}"
    return [ConnectionEvent(time=now, rank=endpoint.rank, status=Status.LOST, reason=why)]


def stuck_entries(target: JobTarget) -> list[RecordEntry]:
    """Where this host's silent ranks are stuck, as their node agent read it from outside.

    One event per rank whose ``<job>.<rank>.stuck`` file names its current, living process:
    folded into a model, it fills ``RankState.stuck`` unless a later state shows the rank
    answering again. Ranks on other hosts have no file here.
    """
    out: list[RecordEntry] = []
    for endpoint in target.endpoints:
        msg = stuck_stacks(endpoint)
        if msg is not None:
            out.append(RecordEntry(time=msg.time, rank=endpoint.rank, message=msg))
    return out


def stuck_stacks(endpoint: Endpoint) -> StacksMsg | None:
    """The main thread's stack of a silent rank as the node agent read it from outside
    (``source`` says how), if it left a report for the rank's current, living process."""
    report = read_stuck(endpoint.job_id, endpoint.rank)
    if report is None or report.pid != endpoint.pid or not discovery.pid_alive(report.pid):
        return None
    return StacksMsg.of_stuck(report)


def unreachable_summary(unreachable: dict[int, str], hosts: dict[int, str]) -> str:
    """One line that tells refusal from silence, and names a host none of whose ranks answered.

    *hosts* maps every rank the viewer tried to reach to its host. "refused" means the rank
    answered and turned our token down (or asked for one we do not have): a token problem,
    not a network one.
    """
    refused = sorted(r for r, why in unreachable.items() if TOKEN_MISSING in why or TOKEN_REFUSED in why)
    silent = sorted(r for r in unreachable if r not in refused)
    parts: list[str] = []
    if refused:
        parts.append(f"{len(refused)} rank(s) refused us, wrong or missing token (DDPTOP_TOKEN, "
                     f"DDPTOP_TOKEN_FILE): {rank_ranges(refused)}")
    if silent:
        parts.append(f"{len(silent)} rank(s) did not answer: {rank_ranges(silent)}")
    by_host: dict[str, list[int]] = {}
    for rank, host in hosts.items():
        by_host.setdefault(host, []).append(rank)
    down = [h for h, ranks in sorted(by_host.items()) if len(by_host) > 1 and all(r in silent for r in ranks)]
    for host in down:
        parts.append(f"none of host {host}'s ranks ({rank_ranges(by_host[host])}) answered: "
                     "is the host down, or its port firewalled?")
    return "; ".join(parts)


def target_hosts(target: JobTarget) -> dict[int, str]:
    """The host of every rank *target* tried to reach (dead local ranks are not "a host down")."""
    return {e.rank: e.host if not e.node or e.node == e.host else f"{e.node} at {e.host}"
            for e in target.endpoints}
