"""The node agent's digest lane: what changed on this node, once per interval, for big jobs.

A viewer of tens of thousands of ranks cannot decode and fold one full state per rank per
second. One that asks a node agent for "digest" gets instead, every interval, one
:class:`~ddptop.protocol.NodeDigest`: the node's summary, every rank's pulse for every sample
(the moving numbers, exact), and the full state only of ranks whose detail key changed
(:mod:`ddptop.digest` says which field is which). Whatever is rare and decisive (a final
state, an exit, a lost connection, a stuck report, a rank's history on reconnecting) goes
at once, as the same event a subscribed viewer gets.

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
        self._details: list[RankState] = []
        self._detail_nos: list[int] = []
        self._no = 0

    def reset(self) -> None:
        """The last digest viewer left: forget what it was told (the next one gets a catch-up)."""
        self._ranks.clear()
        self._pulses.clear()
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
            self._pulses.append((event.time, pulse_of(state, 0.0, after, known.detail_no)))
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
        return digest

    @staticmethod
    def _note(known: _Rank, heard: float, state: RankState, key: tuple[Any, ...]) -> None:
        known.key, known.heard_at, known.status = key, heard, state.status
        known.enqueue_seq, known.ended = last_enqueue_seq(state), state.status in FINAL
