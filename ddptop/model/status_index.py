"""Every rank's status word at a time *now*, kept up to date from the ranks that changed.

The dashboard asks :meth:`JobModel.statuses` at every redraw. A loop over every rank costs
15 ms at 8,192 ranks and 60 ms at 32,768, although between two redraws only the ranks that
sent something differ. This index keeps, per rank, the word that does not depend on the
clock; only "stale" depends on it (a rank that sent nothing for ``STALE_AFTER_S`` turns
stale without any event; one its node agent reported stuck turns stale with that event),
so the ranks that could go stale are kept in buckets by the second of their last receipt,
and a call visits only the buckets old enough to matter.
The teardown context (which failure came first, who is torn down) is recomputed over the
ended ranks only, and only when one of them changed.

Pure: no clock, no threads; the model's ``apply`` names the changed ranks in a set this
index owns (:meth:`JobModel.watch_dirty`), and the caller passes *now*.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from typing import Protocol

from ddptop.model.outcome import Ending, first_failure, resolved_status
from ddptop.model.rank_view import RankView
from ddptop.status import FINAL, STALE_AFTER_S, Status


class Views(Protocol):
    """What the index reads of its model (:class:`ddptop.model.job.JobModel`, which holds it)."""

    ranks: dict[int, RankView]

    def watch_dirty(self, detail_only: bool = False) -> set[int]: ...

_LOST, _STALE, _CONNECTED = Status.LOST.value, Status.STALE.value, Status.CONNECTED.value


class StatusIndex:
    """``statuses(now)`` of one model, updated from its dirty ranks (see module doc)."""

    def __init__(self, model: Views, stale_after_s: float = STALE_AFTER_S) -> None:
        # The model's views, not the model: the model holds this index, and a reference back
        # made every model that had been asked a cycle, freed only by the cyclic collector (the
        # dashboard's background diagnosis drops a copy of 32,768 views and their merged states
        # every few seconds).
        self._ranks = model.ranks
        self.stale_after_s = stale_after_s
        self._dirty = model.watch_dirty()
        # rank -> the status word unless the clock made it stale, in rank order (the old
        # loop's dict order, which callers may show as is)
        self._base: dict[int, str] = {}
        self._ends: dict[int, Ending] = {}
        self._first: Ending | None = None
        # ranks whose word turns stale with time alone: received_at and its bucket
        self._received: dict[int, float] = {}
        # The ranks the last statuses() call found stale by the clock alone (their word is
        # another): the only ranks whose status there differs from words().
        self.stale_by_clock: list[int] = []
        self._buckets: dict[int, set[int]] = {}
        self._keys: list[int] = []  # bucket keys, sorted
        self._dirty.update(model.ranks)

    def statuses(self, now: float) -> dict[int, str]:
        """Status word of every rank at *now* (equal to the full loop's result)."""
        self._fold()
        out = dict(self._base)
        limit = self.stale_after_s
        buckets = self._buckets
        stale: list[int] = []
        for key in self._keys:
            # A bucket holds receipts in [key, key + 1): float subtraction is monotonic, so
            # a bucket is wholly stale, or wholly fresh, from its bounds alone.
            if now - (key + 1) > limit:
                stale.extend(buckets[key])
            elif now - key > limit:
                received = self._received
                stale.extend(r for r in buckets[key] if now - received[r] > limit)
            else:
                break
        out.update(dict.fromkeys(stale, _STALE))
        self.stale_by_clock = stale
        return out

    def copy_for(self, model: Views) -> StatusIndex:
        """This index for *model*, a copy of this index's model whose views are equal
        (:meth:`JobModel.shared_copy`): what it knows copied, what it has yet to fold marked
        dirty there. Building it anew walked every rank (~100 ms at 32,768, in one stretch of the
        background diagnosis that the UI could not interrupt); copying costs ~3 ms."""
        copied = StatusIndex.__new__(StatusIndex)
        copied._ranks = model.ranks
        copied.stale_after_s = self.stale_after_s
        copied._dirty = model.watch_dirty()
        copied._dirty.update(self._dirty)
        copied._base = dict(self._base)
        copied._ends = dict(self._ends)
        copied._first = self._first
        copied._received = dict(self._received)
        copied.stale_by_clock = list(self.stale_by_clock)
        copied._buckets = {key: set(bucket) for key, bucket in self._buckets.items()}
        copied._keys = list(self._keys)
        return copied

    def words(self) -> dict[int, str]:
        """Every rank's word but for the clock: what :meth:`statuses` gives a rank heard just
        now. The index's own dict (read it, never change it)."""
        self._fold()
        return self._base

    # ------------------------------------------------------------ upkeep

    def _fold(self) -> None:
        ranks = self._ranks
        if len(ranks) != len(self._base):
            self._dirty.update(ranks.keys() - self._base.keys())  # a view made outside apply
        if not self._dirty:
            return
        dirty = sorted(self._dirty)
        self._dirty.clear()
        ends_changed = False
        base = self._base
        new = [r for r in dirty if r not in base]
        # New ranks past the last one keep the dict in rank order; others (an attach in any
        # order) re-sort it once.
        ordered = not new or not base or new[0] > next(reversed(base))
        received_of, buckets = self._received, self._buckets
        for rank in dirty:
            view = ranks[rank]
            st = view.base  # status is a detail field: a pulse waiting to be merged cannot change it
            # The usual change: a running rank's new sample, received within the same second
            # as its bucket's (or the next). Inline: 8,192 of these per redraw at 32,768 ranks.
            if st is not None and view.connection == _CONNECTED and view.exit is None \
                    and view.stuck is None and st.status not in FINAL and rank in received_of:
                before = math.floor(received_of[rank])
                after = math.floor(view.received_at)
                received_of[rank] = view.received_at
                if before != after:
                    bucket = buckets[before]
                    bucket.discard(rank)
                    if not bucket:
                        del buckets[before]
                        del self._keys[bisect_left(self._keys, before)]
                    moved = buckets.get(after)
                    if moved is None:
                        moved = buckets[after] = set()
                        insort(self._keys, after)
                    moved.add(rank)
                if self._ends.pop(rank, None) is not None:
                    ends_changed = True
                base[rank] = st.status
                continue
            self._unbucket(rank)
            ended = None if _running(view) else view.ending()
            if ended is None:
                if self._ends.pop(rank, None) is not None:
                    ends_changed = True
                base[rank] = self._live_word(view)
            else:
                if self._ends.get(rank) != ended:
                    self._ends[rank], ends_changed = ended, True
                base[rank] = ended.status  # resolved below
        if ends_changed:
            first = first_failure(self._ends.values())
            resolve = self._ends.keys() if first != self._first else [r for r in dirty if r in self._ends]
            self._first = first
        else:
            resolve = [r for r in dirty if r in self._ends]
        for rank in resolve:
            base[rank] = resolved_status(self._ends[rank], self._first)
        if not ordered:
            self._base = dict(sorted(base.items()))

    def _live_word(self, view: RankView) -> str:
        """``view.live_status`` without the clock; a rank that can go stale is bucketed."""
        if view.connection == _LOST:
            return _LOST
        if view.stuck is not None and view.current_stuck() is not None:
            return _STALE  # found stuck by its node agent: stale whatever the clock says
        st = view.base
        if st is None:
            return "starting" if view.connection == _CONNECTED else view.connection
        if view.connection == _STALE:
            return _STALE
        received = view.received_at
        key = math.floor(received)
        self._received[view.rank] = received
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = set()
            insort(self._keys, key)
        bucket.add(view.rank)
        return st.status

    def _unbucket(self, rank: int) -> None:
        received = self._received.pop(rank, None)
        if received is None:
            return
        key = math.floor(received)
        bucket = self._buckets[key]
        bucket.discard(rank)
        if not bucket:
            del self._buckets[key]
            del self._keys[bisect_left(self._keys, key)]


def _running(view: RankView) -> bool:
    """No exit, no lost connection, no last words: the usual case, decided inline."""
    st = view.base
    return view.exit is None and view.connection != _LOST and (st is None or st.status not in FINAL)
