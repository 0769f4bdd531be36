"""A viewer's side of a node agent's digest lane: pulses and changed details back into states.

A node agent that lists ``"digest"`` in its Hello sends a viewer that asked for it one
:class:`~ddptop.protocol.NodeDigest` per interval instead of a frame per rank per sample
(:mod:`ddptop.agent.digest`). :class:`DigestView` keeps, per rank the agent serves, the
viewer's copy of its last detail, and hands each pulse on with the detail it lies on, one
:class:`~ddptop.digest.PulseBatch` per digest: the model merges a rank's newest pair only
when something reads its state (:func:`ddptop.digest.merged`), which gives the very state a
subscribed viewer would hold, exact on every field a rule or a column reads, on the viewer's
clock. The diagnosis and the table read the model as before.

Gaps are repaired, never guessed over: a digest that did not arrive (its number skipped: the
agent's output cap dropped it) or a pulse whose detail the viewer does not hold leaves the
rank's pulses unused until a fresh state (``Request("state", ranks=...)``) replaces the copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.digest import Milestones, PulseBatch, with_milestones
from ddptop.protocol import Event, NodeDigest, RankState, RecordEntry, StateMsg

MAX_REPAIR_RANKS = 4096  # ranks asked again in one request (Request.ranks is bounded)


@dataclass
class _Copy:
    """The viewer's copy of one rank: the state pulses are laid over, its detail number
    (None: a whole state from a catch-up or a repair, which fits whatever pulse comes next),
    and the default group's milestones the pulses brought since."""

    state: RankState
    detail_no: int | None = None
    enqueued: Milestones = field(default_factory=list)


@dataclass
class DigestView:
    """The digest lane of one node agent connection, turned back into per-rank events."""

    copies: dict[int, _Copy] = field(default_factory=dict)
    last_no: int = 0  # the last digest's number on this connection
    broken: set[int] = field(default_factory=set)  # ranks waiting for a fresh state
    pulses: int = 0  # pulses turned into states (a benchmark's measure)
    skipped: int = 0  # pulses dropped for want of their detail

    def whole(self, event: Event) -> None:
        """An event that came whole (a catch-up, a repair, a final state): a rank's state in it
        is the viewer's new copy."""
        if isinstance(event, RecordEntry) and isinstance(event.message, StateMsg):
            self.copies[event.rank] = _Copy(event.message.state)
            self.broken.discard(event.rank)

    def expand(self, digest: NodeDigest, shift: float) -> tuple[list[Event | PulseBatch], list[int]]:
        """The events of *digest* (its pulses as one batch, times moved by *shift*: our clock
        minus the agent's), and the ranks to ask a fresh state of (a digest or a detail went
        missing)."""
        repair: list[int] = []
        if self.last_no and digest.no != self.last_no + 1:
            # A digest was lost: any rank may have changed its detail in it, so none is shown
            # from its copy until a fresh state replaces it.
            repair.extend(r for r in self.copies if r not in self.broken)
            self.broken.update(repair)
        self.last_no = digest.no
        details: dict[tuple[int, int], RankState] = {
            (state.rank, no): state for state, no in zip(digest.details, digest.detail_nos, strict=False)}
        batch = PulseBatch([], [], [])
        times, states, pulses = batch.times, batch.details, batch.pulses
        at = digest.time + shift
        copies, broken = self.copies, self.broken
        for pulse in digest.pulses:
            rank = pulse.rank
            copy = copies.get(rank)
            # The usual pulse (32,768 a second at that size): its copy is whole and fits, no
            # detail came with it, no milestone to carry. Inline, no call.
            if copy is not None and (copy.detail_no is None or copy.detail_no == pulse.detail_no) \
                    and not details and not pulse.enqueued and not copy.enqueued and rank not in broken:
                copy.detail_no = pulse.detail_no
                times.append(at - pulse.heard_ago)
                states.append(copy.state)
                pulses.append(pulse)
                continue
            detail = details.get((rank, pulse.detail_no))
            if detail is not None and (copy is None or copy.detail_no != pulse.detail_no):
                copy = self.copies[rank] = _Copy(detail, pulse.detail_no)
                self.broken.discard(rank)
            elif copy is None or rank in self.broken or (
                    copy.detail_no is not None and copy.detail_no != pulse.detail_no):
                self.skipped += 1
                if rank not in self.broken:
                    repair.append(rank)
                    self.broken.add(rank)
                continue
            copy.detail_no = pulse.detail_no
            copy.enqueued = with_milestones(pulse, copy.enqueued)
            times.append(at - pulse.heard_ago)
            states.append(copy.state)
            pulses.append(pulse)
        self.pulses += len(pulses)
        events: list[Event | PulseBatch] = [batch] if pulses else []
        return events, sorted(repair)[:MAX_REPAIR_RANKS]
