"""Rank-table rows for the biggest jobs: only the visible rows are built, the rest are groups.

Above :data:`GROUP_FROM_RANKS` ranks, :class:`~ddptop.tui.rows.RowBuilder` (one row per rank
at every redraw: 56 ms at 8,192 ranks even with every row memoized) gives way to a
:class:`RowIndex`. It keeps, for the ranks the model marked dirty only, what a row and its
marks depend on (the facts, the job's leads as counters, the groups each rank belongs to),
finds the *odd* ranks (the candidates for a mark, checked with the same ``marks_of``), and
hands the table a :class:`RowSequence` that builds a row when the table paints it.

Views (key ``g``): ``ranks`` (every rank, as :func:`~ddptop.tui.rows.build_rows` shows
them), ``odd`` (the odd ranks worst first, then one group row per status and collective
for the rest), ``node``, ``status`` and ``collective`` (group rows). Enter on a group row
expands it in place.
"""

from __future__ import annotations

from collections import Counter
from typing import cast

from ddptop.diagnosis.desync import (
    BAD_STATUS,
    MISMATCH,
    JobLeads,
    RankFacts,
    marks_of,
)
from ddptop.model.job import JobModel
from ddptop.status import Status
from ddptop.tui.group_ranges import GroupRanges
from ddptop.tui.index_upkeep import OpKey, count, flag, majority, move, recount, set_value
from ddptop.tui.row_sequence import RowSequence
from ddptop.tui.rows import GroupRow, RankRow, _row, _short_op
from ddptop.tui.view_facts import facts_of_view, pulse_facts

GROUP_FROM_RANKS = 1024  # at or below, every rank has its row (RowBuilder, as always)
VIEWS = ("ranks", "odd", "node", "status", "collective")
COMPUTING = "computing"  # the collective key of a rank in no collective
_KINDS = ("node", "status", "collective", "rest")
_UNKNOWN = ("unknown",)
# Odd ranks worst first: gone or failed, then silent, then disagreeing with their peers.
_WORST: dict[str, int] = {Status.LOST: 0, Status.CRASHED: 0, Status.TERMINATED: 0, Status.TORN_DOWN: 1,
                          Status.STALE: 2}

class RowIndex:
    """Facts, leads, odd ranks and groups of one model, kept from its dirty ranks."""

    def __init__(self, model: JobModel, view: str = "odd") -> None:
        self.model = model
        self.view = view
        self.expanded: set[tuple[str, ...]] = set()  # (kind, *key) of the groups shown open
        self._dirty = model.watch_dirty()
        self._dirty.update(model.ranks)
        self.statuses: dict[int, str] = {}  # of the latest refresh (the header reuses them)
        self.word_counts: Counter[str] = Counter()  # of those statuses, kept from the ones that moved
        self.leads = JobLeads(0, 0, None, 0, {})
        self.marks: dict[int, list[str]] = {}  # the odd ranks' marks
        self.odd: list[int] = []  # worst first
        self._facts: dict[int, RankFacts] = {}
        self._step: dict[int, int] = {}  # ranks with a state
        self._seq: dict[int, int] = {}  # ranks with a default group
        self._bpe: dict[int, int] = {}
        self._bpes: Counter[int] = Counter()
        self._bpe_ranks: dict[int, set[int]] = {}
        self._op: dict[int, OpKey] = {}  # the oldest pending op's ((group, seq), op)
        self._ops: dict[tuple[str, int], Counter[str]] = {}  # leads' ops_at_seq
        self._op_ranks: dict[OpKey, set[int]] = {}
        self._age: dict[int, float] = {}
        self._seq_stuck: set[int] = set()
        self._step_stuck: set[int] = set()
        self._bad: set[int] = set()
        self._keys: dict[int, tuple[tuple[str, ...], ...]] = {}  # per kind of _KINDS
        self._groups: dict[str, dict[tuple[str, ...], set[int]]] = {k: {} for k in _KINDS}
        self._ranges: GroupRanges | None = None  # of the groups of the kind on screen
        self._odd_by_key: dict[tuple[str, ...], list[tuple[int | None, int | None]]] | None = None
        self._memo: dict[int, tuple[int, str, RankFacts, RankRow]] = {}
        self._detail: dict[int, object] = {}  # the state object each rank's facts were read over
        self._absorbed: set[int] = set()  # folded by absorb() since the last refresh
        self._all: tuple[tuple[int, int], list[int], list[int]] = ((-1, -1), [], [])  # all, unknown

    # ------------------------------------------------------------ upkeep

    def refresh(self, now: float) -> RowSequence:
        """Catch up with the model at *now*; the rows of the current view."""
        statuses = self.model.statuses(now)
        changed = set(self._dirty)
        self._dirty.clear()
        if statuses != self.statuses:  # C-level; differs when a rank turned stale with time
            prev, counts = self.statuses, self.word_counts
            moved = [r for r, s in statuses.items() if prev.get(r) != s]
            changed.update(moved)
            recount(counts, prev, statuses, moved)  # the header's, without a pass over every rank
        self.statuses = statuses
        if self._absorbed:  # folded with their word but for the clock: redo those it changed
            # Only a rank the clock made stale can differ (a word changed since its absorb is
            # that rank's event, dirty again, or a change since the last refresh, moved): a
            # pass over those, not over the 16,384 absorbed since the last redraw (6 ms).
            facts, absorbed = self._facts, self._absorbed
            changed.update([r for r in self.model.stale_by_clock()
                            if r in absorbed and facts[r].status != statuses[r]])
            absorbed.clear()
        self._fold_ranks(changed, statuses)
        self.leads = leads = JobLeads(max(self._seq.values(), default=0), max(self._step.values(), default=0),
                                      majority(self._bpes), len(self._bpes), self._ops)
        facts = self._facts
        marks = {r: m for r in self._candidates(leads) if (m := marks_of(facts[r], leads))}
        self.marks = marks
        self.odd = sorted(marks, key=lambda r: (_worst(statuses[r], marks[r]), r))
        self._odd_by_key = None
        return self._sequence()

    def absorb(self) -> None:
        """The per-rank part of :meth:`refresh` for the ranks changed since, done as their
        events arrive (the app calls it after each fold of events): at 32,768 ranks a redraw
        then has a few hundred ranks left, not 8,000, and a key waits for slices of work."""
        if self._dirty:
            changed = set(self._dirty)
            self._dirty.clear()
            self._fold_ranks(changed, self.model.status_words())
            self._absorbed |= changed
            if self._odd_by_key is not None and not changed.isdisjoint(self.marks):
                # An odd rank moved: a group painted from now on leaves it out where it is now.
                self._odd_by_key = None

    def _fold_ranks(self, changed: set[int], statuses: dict[int, str]) -> None:
        views, facts, detail = self.model.ranks, self._facts, self._detail
        seq_of, step_of, ranges = self._seq, self._step, self._ranges
        for rank in changed:
            status, view, old = statuses[rank], views[rank], facts.get(rank)
            # The usual change at scale: a pulse over the detail the last facts came from.
            f = pulse_facts(view, old, status) if old is not None and detail.get(rank) is view.base else None
            if f is None or old is None:
                self._update(rank, status)
                detail[rank] = view.base
                continue
            facts[rank] = f
            step_of[rank] = f.step
            if ranges is not None:  # same detail, word and op: the rank's groups are the same
                ranges.moved(self._keys[rank][ranges.slot], old.step, f.step, old.seq, f.seq)
            if f.seq != old.seq:
                set_value(seq_of, rank, f.seq)
            if f.seq_stuck != old.seq_stuck:
                flag(self._seq_stuck, rank, f.seq_stuck)
            if f.step_stuck != old.step_stuck:
                flag(self._step_stuck, rank, f.step_stuck)

    def _update(self, rank: int, status: str) -> None:
        # Inline and field by field, only what moved: 8,192 ranks per redraw at 32,768 ranks.
        view = self.model.ranks[rank]
        st = view.base  # host is a detail field: no merge of a waiting pulse
        f = facts_of_view(view, status)
        old = self._facts.get(rank)
        self._facts[rank] = f
        if f.has_state:
            self._step[rank] = f.step
        elif old is not None and old.has_state:
            del self._step[rank]
        if old is None or old.seq != f.seq:
            set_value(self._seq, rank, f.seq)
        if old is None or old.bpe != f.bpe:
            move(self._bpe, self._bpes, self._bpe_ranks, rank, f.bpe)
        pending = f.op
        op = None if pending is None else ((f.pg, pending.seq), pending.op)
        before = self._op.get(rank)
        if before != op:
            if before is not None:
                del self._op[rank]
                count(self._ops, self._op_ranks, rank, before, -1)
            if op is not None:
                self._op[rank] = op
                count(self._ops, self._op_ranks, rank, op, 1)
        if pending is not None:
            self._age[rank] = pending.age_s
        elif before is not None:
            self._age.pop(rank, None)
        if old is None or old.seq_stuck != f.seq_stuck:
            flag(self._seq_stuck, rank, f.seq_stuck)
        if old is None or old.step_stuck != f.step_stuck:
            flag(self._step_stuck, rank, f.step_stuck)
        if old is None or old.status != status:
            flag(self._bad, rank, status in BAD_STATUS)
        # By op, not by seq: ranks a seq apart (sampling skew) are one group, and a healthy
        # rank's keys stay the same from sample to sample (the row shows the seq range).
        coll = (COMPUTING,) if pending is None else (_short_op(pending.op),)
        keys = ((st.host if st is not None else "",), (status,), coll, (status, *coll))
        before_keys = self._keys.get(rank)
        if before_keys != keys:
            self._keys[rank] = keys
            for kind, new, prev in zip(_KINDS, keys, before_keys or (None,) * 4, strict=True):
                if new != prev:
                    groups = self._groups[kind]
                    if prev is not None:
                        members = groups[prev]
                        members.discard(rank)
                        if not members:
                            del groups[prev]
                    groups.setdefault(new, set()).add(rank)
        ranges = self._ranges
        if ranges is not None:  # _step and _seq hold the facts' step (with a state) and seq
            slot = ranges.slot
            step = f.step if f.has_state else None
            if old is None or before_keys is None:
                ranges.add(keys[slot], step, f.seq)
            elif before_keys[slot] == keys[slot]:
                ranges.moved(keys[slot], old.step if old.has_state else None, step, old.seq, f.seq)
            else:
                ranges.remove(before_keys[slot], old.step if old.has_state else None, old.seq)
                ranges.add(keys[slot], step, f.seq)

    def _candidates(self, leads: JobLeads) -> set[int]:
        """A superset of the ranks with a mark (each is then checked with ``marks_of``)."""
        found = set(self._bad)
        seq, step = self._seq, self._step
        found.update([r for r in self._seq_stuck if seq[r] < leads.max_seq])
        found.update([r for r in self._step_stuck if step[r] < leads.max_step])
        for at, counts in self._ops.items():
            if len(counts) > 1:  # the minority op at a seq, or everyone at a tie
                top = counts.most_common(2)
                for op, n in counts.items():
                    if n < top[0][1] or top[0][1] == top[1][1]:
                        found |= self._op_ranks[(at, op)]
        if leads.distinct_bpe > 1:
            for bpe, members in self._bpe_ranks.items():
                if bpe != leads.common_bpe:
                    found |= members
        return found

    # ------------------------------------------------------------ rows

    def _known(self) -> tuple[list[int], list[int]]:
        """Every rank id shown (known and never heard from) in order, and the unknown ones."""
        ranks, world = self.model.ranks, self.model.world_size
        if self._all[0] != (len(ranks), world):
            unknown = sorted(set(range(world)) - ranks.keys())
            self._all = ((len(ranks), world), sorted([*ranks, *unknown]), unknown)
        return self._all[1], self._all[2]

    def _sequence(self) -> RowSequence:
        everyone, unknown = self._known()
        if self.view == "ranks":
            return RowSequence(self, everyone, by_rank=True)
        entries: list[int | GroupRow] = []
        if self.view == "odd":
            entries.extend(self.odd)
            odd = set(self.odd)
            kind = "rest"
            groups = {k: m - odd for k, m in self._groups[kind].items()}
        else:
            kind = self.view
            # Copies: absorb() moves ranks between the live sets before the rows are painted.
            groups = {k: set(m) for k, m in self._groups[kind].items()}
        if self._ranges is None or self._ranges.kind != kind:
            self._ranges = GroupRanges(kind, _KINDS.index(kind))
            self._ranges.count_all(self._keys, self._step, self._seq)
        # Nodes by name; statuses and collectives biggest first.
        by_size = kind != "node"
        order = sorted(groups.items(), key=lambda i: (-len(i[1]) if by_size else 0, i[0]))
        if unknown:
            order.append((_UNKNOWN, set(unknown)))
        for key, members in order:
            if not members:
                continue
            group_kind = "unknown" if key is _UNKNOWN else kind
            group = GroupRow(group_kind, key, members, expanded=(group_kind, *key) in self.expanded)
            entries.append(group)
            if group.expanded:
                entries.extend(sorted(members))
        return RowSequence(self, entries, by_rank=False)

    def row(self, rank: int) -> RankRow:
        """The row of *rank*, as ``build_rows`` makes it (memoized while the rank is unchanged)."""
        view, status = self.model.ranks.get(rank), self.statuses.get(rank)
        if view is None or status is None:  # never heard from, or only since the last refresh
            return RankRow(rank=rank, status=Status.UNKNOWN)
        f, leads = self._facts[rank], self.leads
        hit = self._memo.get(rank)
        # The facts too (by identity, a new object at each fold): a row painted between an
        # event and the fold of its rank holds the facts of before; once folded it is rebuilt.
        if hit is not None and hit[0] == view.version and hit[1] == status and hit[2] is f:
            built = hit[3]
        else:
            built = _row(view, status, f)
            self._memo[rank] = (view.version, status, f, built)
        built.marks = list(self.marks.get(rank, ()))  # marks_of(facts, leads) of the last refresh
        # Folded since the refresh (absorb), a rank's seq can pass the refresh's lead: no lag.
        built.seq_lag = max(0, leads.max_seq - built.seq) if built.seq is not None else 0
        return built

    @property
    def every_fact(self) -> dict[int, RankFacts]:
        """What each rank's row was read from: folded at the last refresh, or by absorb() since
        (the sort reads them; never change them)."""
        return self._facts

    def known(self) -> list[int]:
        """Every rank id shown at the last refresh (known and never heard from), ascending.

        Not the model's ranks now: a sort key or a filter pressed between two refreshes (ranks
        still joining) must build rows only of ranks with a status and facts of that refresh."""
        return self._all[1]

    def every_row(self) -> list[RankRow]:
        """Every rank's row in rank order (a sort by another column, a filter: O(ranks))."""
        return [self.row(r) for r in self._all[1]]

    def filled(self, group: GroupRow) -> GroupRow:
        """*group* with its counts and ranges (computed once, when it is painted)."""
        if group.status_counts:
            return group
        members = group.ranks
        if group.kind == "unknown":
            group.status_counts = {Status.UNKNOWN.value: len(members)}
            return group
        if group.kind in ("status", "rest"):
            group.status_counts = {group.key[0]: len(members)}  # one status by construction
        else:  # the members' words of the refresh that made the group
            group.status_counts = dict(Counter(map(self.statuses.__getitem__, members)))
        key = group.key
        ranges = self._ranges
        if ranges is not None and ranges.kind == group.kind:
            # Kept as ranks fold: the group's members now (absorb() may have moved a few since
            # the refresh that made the row), the odd view's odd ranks taken out.
            apart = self._odd_values(ranges.slot).get(key, []) if group.kind == "rest" else []
            (group.step_lo, group.step_hi), (group.seq_lo, group.seq_hi) = ranges.ranges(key, apart)
        else:
            steps = _values_of(self._step, members)
            if steps:
                group.step_lo, group.step_hi = min(steps), max(steps)
            seqs = _values_of(self._seq, members)
            if seqs:
                group.seq_lo, group.seq_hi = min(seqs), max(seqs)
        if group.kind in ("collective", "rest") and key[-1] != COMPUTING:
            # Every member waited in this op at the refresh (((group, seq), op) keys); absorb()
            # may have seen some leave it since.
            at = [a[0][1] for a in map(self._op.get, members) if a is not None]
            ages = [a for a in map(self._age.get, members) if a is not None]
            if at:
                lo, hi = min(at), max(at)
                group.pending = f"{key[-1]} #{lo}" if lo == hi else f"{key[-1]} #{lo}-{hi}"
            group.oldest_wait_s = max(ages, default=None)
        marked = self.marks.keys() & members
        group.marks = list(dict.fromkeys(m for r in sorted(marked) for m in self.marks[r]))
        return group

    def _odd_values(self, slot: int) -> dict[tuple[str, ...], list[tuple[int | None, int | None]]]:
        # The odd ranks' (step, seq) by their group key: one pass over them per refresh, not
        # one per group painted (a desync can mark thousands).
        if self._odd_by_key is None:
            keys = self._keys
            by_key: dict[tuple[str, ...], list[tuple[int | None, int | None]]] = {}
            for r in self.odd:
                by_key.setdefault(keys[r][slot], []).append((self._step.get(r), self._seq.get(r)))
            self._odd_by_key = by_key
        return self._odd_by_key

    def cycle(self) -> str:
        """The next view of :data:`VIEWS`; returns its name."""
        self.view = VIEWS[(VIEWS.index(self.view) + 1) % len(VIEWS)]
        return self.view

    def toggle(self, key: tuple[str, ...]) -> None:
        """Expand or fold the group ``(kind, *key)``."""
        self.expanded ^= {key}


def _values_of(values: dict[int, int], members: set[int]) -> list[int]:
    # The members' values, those that have one. C-level maps: a group of 32,768 ranks is summed
    # at every redraw that paints it (a set intersection first cost twice as much).
    got = list(map(values.get, members))
    return [v for v in got if v is not None] if None in got else cast("list[int]", got)


def _worst(status: str, marks: list[str]) -> int:
    return _WORST.get(status, 3 if MISMATCH in marks else 4)
