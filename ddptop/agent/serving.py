"""What the node's endpoint answers from the agent's model: pure over the model, no sockets.

Apart from :mod:`ddptop.agent.endpoint` (which serves, and so loads the rank-side server) so
that the node agent can be imported without the reporter.
"""

from __future__ import annotations

import threading
import time
from itertools import islice

import msgspec
from msgspec.structs import replace

from ddptop.client.live import LiveSource
from ddptop.model.job import JobModel
from ddptop.protocol import (
    CollectiveGroup,
    ErrorMsg,
    Event,
    HistoryMsg,
    RankState,
    RecordEntry,
    StacksMsg,
    StateMsg,
)

__all__ = ["Event", "ask_ranks", "model_catch_up", "news_stacks", "news_state", "selected"]

MAX_REASON = 2000  # characters of a last word sent to the other agents
MAX_FRAMES = 32  # frames of a stuck report sent to the other agents


def model_catch_up(model: JobModel, ranks: set[int], now: float, samples: int | None = None) -> list[Event]:
    """What *model* knows about each of *ranks* (the node's own): history (its last *samples*
    only, when given), last state, where it is stuck, its exit, as a viewer that connects
    gets it first."""
    entries: list[Event] = []
    for rank in sorted(r for r in model.ranks if r in ranks):
        view = model.ranks[rank]
        at = view.received_at or now
        if view.history and samples != 0:
            ring = view.history
            start = max(0, len(ring) - samples) if samples is not None else 0
            history = HistoryMsg(rank=rank, samples=list(islice(ring, start, None)))
            entries.append(RecordEntry(time=at, rank=rank, message=history))
        if view.state is not None:
            entries.append(RecordEntry(time=at, rank=rank, message=StateMsg(state=view.state)))
        if view.stacks is not None and view.current_stuck() is not None:
            entries.append(RecordEntry(time=view.stacks.time, rank=rank, message=view.stacks))
        if view.exit is not None:
            entries.append(view.exit)
    return entries


def selected(entries: list[Event], ranks: set[int] | None, samples: int | None) -> list[Event]:
    """*entries* of *ranks* only (None: all), histories cut to their last *samples*: a
    request's ``ranks`` and a digest's catch-up, over a catch-up made without them."""
    out: list[Event] = []
    for entry in entries:
        if ranks is not None and entry.rank not in ranks:
            continue
        if samples is not None and isinstance(entry, RecordEntry) and isinstance(entry.message, HistoryMsg):
            cut = entry.message.samples[-samples:] if samples else []
            entry = replace(entry, message=replace(entry.message, samples=cut))
        out.append(entry)
    return out


def ask_ranks(live: LiveSource, model: JobModel, lock: threading.Lock, ranks: set[int], command: str,
              timeout: float) -> list[Event]:
    """Stacks or Flight Recorder dumps of every one of *ranks* that still runs; a rank that
    cannot answer gets where it is stuck (read from outside), else why not."""
    now = time.time()
    with lock:
        running = [r for r, view in model.ranks.items() if view.ending() is None and r in ranks]
    if command == "fr_trace":
        traces = live.request_fr_traces(running, timeout)
        return [RecordEntry(time=now, rank=r, message=m) for r, m in sorted(traces.items())]
    result = live.request_stacks(running, timeout)
    entries: list[Event] = [RecordEntry(time=now, rank=r, message=m)
                            for r, m in sorted(result.stacks.items())]
    with lock:
        for rank, why in sorted(result.errors.items()):
            view = model.ranks.get(rank)
            stuck = view.stacks if view is not None and view.current_stuck() is not None else None
            entries.append(RecordEntry(time=now, rank=rank, message=stuck or ErrorMsg(reason=why)))
    return entries


def news_state(state: RankState) -> RankState:
    """*state* as the other agents get it: what a post-mortem reads (identity, progress,
    how it ended, pending collectives, loaders, memory), without the bulk (recent ops, env)."""
    groups = [CollectiveGroup(pg=g.pg, seq=g.seq, size=g.size, pending=g.pending[:4], ranks=g.ranks,
                              last_completed=g.last_completed, enqueued=g.enqueued)
              for g in state.collectives[:16]]
    return msgspec.structs.replace(state, collectives=groups, env={},
                                   exit_reason=state.exit_reason[-MAX_REASON:],
                                   worker_crashes=state.worker_crashes[:2], loader_worker_pids=[])


def news_stacks(stacks: StacksMsg) -> StacksMsg:
    """A stuck report as the other agents get it: its innermost frames only."""
    threads = [msgspec.structs.replace(t, frames=t.frames[-MAX_FRAMES:]) for t in stacks.threads[:1]]
    stuck = stacks.stuck
    if stuck is not None:
        stuck = msgspec.structs.replace(stuck, frames=stuck.frames[-MAX_FRAMES:])
    return msgspec.structs.replace(stacks, threads=threads, stuck=stuck)
