"""The node agent's digest lane: what changed on this node, once per interval, for big jobs.

A viewer of tens of thousands of ranks cannot decode and fold one full state per rank per
second. One that asks a node agent for "digest" gets instead, every interval, one
:class:`~ddptop.protocol.NodeDigest`: the node's summary, one pulse per rank heard (the moving
numbers of its newest state, exact, with the samples heard before it in the interval as
history points), and the full state only of ranks whose detail key changed
(:mod:`ddptop.digest` says which field is which). A rank whose detail changed within the
interval has a pulse for each detail, so no detail is skipped over.

From :data:`WIDE_FROM_RANKS` ranks a digest spans two sample intervals (:attr:`DigestBuilder.span`):
the viewer then folds one pulse per rank every two seconds, half the work, and still gets
every sample. A rank's values are then at most two seconds old, well inside the five a row
waits before it turns stale (``ddptop.status.STALE_AFTER_S``). Whatever is rare and decisive (a
final state, an exit, a lost connection, a stuck report, a rank's history on reconnecting)
does not wait for a digest: it goes at once, as the same event a subscribed viewer gets.

:class:`DigestBuilder` is fed on the endpoint's loop thread with the events the agent
publishes for its own ranks, and only while a digest peer is connected: a job nobody watches
this way pays nothing. Not thread-safe on purpose: one thread owns it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ddptop.diagnosis import HISTORY_MARGIN_S, DiagnosisConfig
from ddptop.digest import detail_key, last_enqueue_seq, pulse_of
from ddptop.protocol import Event, NodeDigest, NodeSummary, Pulse, RankExit, RankState, RecordEntry, StateMsg
from ddptop.status import FINAL, SAMPLE_INTERVAL_S, silent_after_s

# The samples a digest viewer gets per rank when it connects: what the rate rules look back
# at (their window plus the margin for clocks behind), not the agent's whole ring.
CATCHUP_SAMPLES = int((DiagnosisConfig().window_s + HISTORY_MARGIN_S) / SAMPLE_INTERVAL_S)
DIGEST_S = SAMPLE_INTERVAL_S  # one NodeDigest per sample interval: a pulse waits at most one
# From this job size a digest spans WIDE_SPAN intervals: at 32,768 ranks one pulse per rank per
# second cost a viewer 350 ms of CPU a second (docs/performance.md), over its 250 ms goal.
WIDE_FROM_RANKS, WIDE_SPAN = 16_384, 2
# Samples a pulse carries from before its own: one at the wide span and 1 Hz; a rank sampled
# at 20 Hz has 39. A stalled loop thread must not build a pulse the protocol refuses: the
# oldest go (the viewer's history has a gap there, never a wrong point).
MAX_EARLIER = 64


@dataclass
class _Rank:
    """What the lane last told its viewers of one rank."""

    key: tuple[Any, ...] | None = None  # detail key of the viewers' copy (None: they have none)
    detail_no: int = 0
    enqueue_seq: int = -1  # newest default-group milestone already sent
    heard_at: float = 0.0  # agent wall clock of its last state
    status: str = ""  # its own word in that state
    ended: bool = False  # a final state or an exit: not silent, it is gone


class DigestBuilder:
    """Collects one node's pulses and changed details between two :meth:`flush` calls."""

    def __init__(self, host: str, silent_s: float | None = None) -> None:
        self.host = host
        self._silent_s = silent_after_s() if silent_s is None else silent_s
        self._ranks: dict[int, _Rank] = {}
        self._pulses: list[tuple[float, Pulse]] = []  # (agent time heard, pulse), oldest first
        self._slot: dict[int, int] = {}  # rank -> index in _pulses of its newest pulse
        self.world_size = 0  # the job's, as its ranks' states say
        self._details: list[RankState] = []
        self._detail_nos: list[int] = []
        self._no = 0

    def reset(self) -> None:
        """The last digest viewer left: forget what it was told (the next one gets a catch-up)."""
        self._ranks.clear()
        self._pulses.clear()
        self._slot.clear()
        self._details.clear()
        self._detail_nos.clear()

    def seed(self, entries: list[Event]) -> None:
        """A viewer got *entries* as its catch-up: its copy of each rank the lane does not
        track yet is that state. A tracked rank keeps its record: an earlier viewer's copy is
        what the next pulses must fit (the newcomer's newer copy only sees stale pulses)."""
        for entry in entries:
            if isinstance(entry, RecordEntry) and isinstance(entry.message, StateMsg) and \
                    entry.rank not in self._ranks:  # the catch-up is its detail number 0
                state = entry.message.state
                self._note(self._ranks.setdefault(entry.rank, _Rank()), entry.time, state, detail_key(state))

    def add(self, event: Event) -> bool:
        """Take one of the node's events; True when it must go to digest viewers at once (as
        is), False when a pulse (and maybe a detail) of the next digest carries it."""
        if isinstance(event, RecordEntry) and isinstance(event.message, StateMsg):
            state = event.message.state
            known = self._ranks.get(event.rank)
            if known is None:  # not setdefault: that builds a _Rank at every state
                known = self._ranks[event.rank] = _Rank()
            if state.status in FINAL:  # last words go whole, at once: the viewers' copy is this
                self._note(known, event.time, state, detail_key(state))
                return True
            after = known.enqueue_seq
            key = detail_key(state)
            if key != known.key:
                known.detail_no += 1
                self._details.append(state)
                self._detail_nos.append(known.detail_no)
            self._note(known, event.time, state, key)
            self._take(event.rank, event.time, pulse_of(state, 0.0, after, known.detail_no))
            return False
        if isinstance(event, RankExit):
            self._ranks.setdefault(event.rank, _Rank()).ended = True
        return True

    def flush(self, now: float, dropped: int = 0) -> NodeDigest:
        """The digest of everything added since the last flush, at agent time *now*."""
        for heard, pulse in self._pulses:
            pulse.heard_ago = max(0.0, now - heard)
        silent = [r for r, x in self._ranks.items() if not x.ended and now - x.heard_at > self._silent_s]
        counts = Counter(x.status for x in self._ranks.values() if x.status)
        summary = NodeSummary(host=self.host, ranks=sorted(self._ranks), silent=sorted(silent),
                              status_counts=dict(counts), dropped=dropped)
        self._no += 1
        digest = NodeDigest(time=now, no=self._no, summary=summary, details=self._details,
                            detail_nos=self._detail_nos, pulses=[p for _, p in self._pulses])
        self._pulses, self._details, self._detail_nos = [], [], []
        self._slot.clear()
        return digest

    @property
    def span(self) -> int:
        """Sample intervals one digest spans: :data:`WIDE_SPAN` for a job of
        :data:`WIDE_FROM_RANKS` ranks or more, else one."""
        return WIDE_SPAN if self.world_size >= WIDE_FROM_RANKS else 1

    def _take(self, rank: int, heard: float, pulse: Pulse) -> None:
        """*pulse* into the next digest: over the rank's pulse of this interval when both lie
        on the same detail (the older one's sample and milestones go along), else after it."""
        slot = self._slot.get(rank)
        if slot is not None:
            older = self._pulses[slot][1]
            if older.detail_no == pulse.detail_no:
                pulse.earlier = [*older.earlier, older.sample][-MAX_EARLIER:]
                if older.enqueued:  # the milestones since the digest before: the viewer's gap
                    kept = pulse.enqueue_kept
                    pulse.enqueued = [*older.enqueued, *pulse.enqueued][-kept:] if kept else []
                self._pulses[slot] = (heard, pulse)
                return
        self._slot[rank] = len(self._pulses)
        self._pulses.append((heard, pulse))

    def _note(self, known: _Rank, heard: float, state: RankState, key: tuple[Any, ...]) -> None:
        # What the viewers now hold of the rank; and the job's size, which sets the span.
        if state.world_size > self.world_size:
            self.world_size = state.world_size
        known.key, known.heard_at, known.status = key, heard, state.status
        known.enqueue_seq, known.ended = last_enqueue_seq(state), state.status in FINAL
