"""RowIndex (the rank table above GROUP_FROM_RANKS ranks) against build_rows.

In the ``ranks`` view its rows must be exactly what build_rows makes, read after random
event streams (ranks that step, enter collectives, disagree, go silent, crash, get lost),
refreshed between events as the dashboard does; its odd view lists the marked ranks first.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddptop.agent.digest import DigestBuilder
from ddptop.client.digest_view import DigestView
from ddptop.model.job import JobModel
from ddptop.protocol import ConnectionEvent, Event, RankExit, RecordEntry, StateMsg
from ddptop.testing.synthetic_ranks import FakeRanks
from ddptop.tui.app import DdptopApp
from ddptop.tui.row_index import RowIndex
from ddptop.tui.row_sequence import RowSequence
from ddptop.tui.rows import GroupRow, RankRow, build_rows
from ddptop.tui.sort_filter import SORT_KEYS, sort_rows
from ddptop.tui.widgets.rank_table import RankTable
from tests.probes_tui.fakes import NOW, state

RANKS = 24

states = st.builds(
    lambda r, step, seq, bpe, op, stuck, host, age: RecordEntry(
        time=NOW - age, rank=r, message=StateMsg(state=state(
            r, step=step, seq=seq, bpe=bpe, op=op, op_seq=seq + 1 if op else None, stuck=stuck,
            host=host, world=RANKS + 2, t=NOW - age))),
    st.integers(0, RANKS - 1), st.integers(98, 100), st.integers(298, 300),
    st.sampled_from([64, 64, 57, None]),
    st.sampled_from([None, None, "gloo:all_reduce", "gloo:all_gather"]), st.booleans(),
    st.sampled_from(["node-a", "node-b"]), st.sampled_from([0.0, 0.5, 30.0]))
others = st.one_of(
    st.builds(lambda r: ConnectionEvent(time=NOW, rank=r, status="lost", reason="x"), st.integers(0, RANKS)),
    st.builds(lambda r, sig: RankExit(time=NOW, rank=r, pid=1000 + r, signal=sig),
              st.integers(0, RANKS - 1), st.sampled_from(["SIGSEGV", "SIGTERM"])))
streams = st.lists(st.tuples(st.one_of(states, states, states, others), st.booleans()),
                   min_size=1, max_size=60)


def _rows(index: RowIndex, now: float) -> list[RankRow]:
    shown = list(index.refresh(now))
    assert all(isinstance(r, RankRow) for r in shown)
    # The header's word counts, kept from the ranks whose word moved, are a count of every rank's.
    assert index.word_counts == Counter(index.statuses.values())
    return [r for r in shown if isinstance(r, RankRow)]


@settings(max_examples=150, deadline=None)
@given(streams)
def test_ranks_view_equals_build_rows(stream: list[tuple[Event, bool]]) -> None:
    model = JobModel()
    index = RowIndex(model, view="ranks")
    for event, read in stream:
        model.apply(event)
        if read:
            assert _rows(index, NOW) == build_rows(model, NOW)
    for now in (NOW, NOW + 10.0):
        assert _rows(index, now) == build_rows(model, now)


# What the app does between two refreshes: fold a batch of events and absorb it, or paint.
between = st.sampled_from(["absorb", "absorb", "paint", "nothing"])


@settings(max_examples=150, deadline=None)
@given(streams, st.lists(between, min_size=60, max_size=60))
def test_ranks_absorbed_between_refreshes_give_the_rows_of_a_fresh_build(
        stream: list[tuple[Event, bool]], doings: list[str]) -> None:
    """absorb() folds ranks as their events arrive with their word but for the clock; a refresh
    then redoes the ones the clock changed: its rows equal build_rows, at any later moment too.
    Rows painted in between (absorbed ranks in the groups of the last refresh) never fail."""
    model = JobModel()
    index = RowIndex(model, view="odd")
    shown: RowSequence | None = None
    for (event, read), doing in zip(stream, doings, strict=False):
        model.apply(event)
        if doing == "absorb":
            index.absorb()
        elif doing == "paint" and shown is not None:
            list(shown)
            _same_order(index, shown)
        if read:
            index.view = "ranks"
            got, want = _rows(index, NOW), build_rows(model, NOW)
            assert [(a, b) for a, b in zip(got, want, strict=True) if a != b] == []
            index.view = "odd"
            shown = index.refresh(NOW)
    index.absorb()
    for now in (NOW, NOW + 10.0):
        index.view = "ranks"
        assert _rows(index, now) == build_rows(model, now)


@settings(max_examples=150, deadline=None)
@given(streams, st.lists(st.booleans(), min_size=60, max_size=60))
def test_a_row_painted_between_an_event_and_its_fold_is_rebuilt_after(
        stream: list[tuple[Event, bool]], paints: list[bool]) -> None:
    """The table paints while events arrive: a row built then holds its rank's facts of before.
    Memoized under the new version alone, it kept them after the fold (seen: seq 299 shown with
    a lag of -1 where the rank's state said 298) until the rank changed again."""
    model = JobModel()
    index = RowIndex(model, view="ranks")
    shown: RowSequence | None = None
    for (event, read), paint in zip(stream, paints, strict=False):
        model.apply(event)
        if paint and shown is not None:
            list(shown)
        if read:
            shown = index.refresh(NOW)
            assert list(shown) == build_rows(model, NOW)


def _same_order(index: RowIndex, seq: RowSequence) -> None:
    """Sorted by any column either way, the index's order is sort_rows' order of every row."""
    rows = index.every_row()
    for key in SORT_KEYS:
        for reverse in (False, True):
            want = sort_rows(rows, key, reverse)
            got = seq.sorted(key, reverse)
            assert [r.rank for r in got] == [r.rank for r in want], (key, reverse)
            assert list(got) == want, (key, reverse)


@settings(max_examples=60, deadline=None)
@given(streams)
def test_sorted_by_any_column_equals_sort_rows_of_every_row(stream: list[tuple[Event, bool]]) -> None:
    model = JobModel()
    index = RowIndex(model, view="ranks")
    for event, read in stream:
        model.apply(event)
        if read:
            _same_order(index, index.refresh(NOW))
    _same_order(index, index.refresh(NOW + 10.0))


def test_a_rank_heard_after_the_refresh_joins_the_sorted_rows_at_the_next_one() -> None:
    """A sort key or a filter pressed between two refreshes (ranks still joining during an
    attach) orders and builds the ranks of the last refresh: a rank the model got since has
    no facts or status yet, and its row waits for the next refresh."""
    model = JobModel()
    for r in range(4):
        model.apply(RecordEntry(time=NOW, rank=r, message=StateMsg(state=state(r, world=8, t=NOW))))
    index = RowIndex(model, view="odd")
    seq = index.refresh(NOW)
    model.apply(RecordEntry(time=NOW, rank=5, message=StateMsg(state=state(5, world=8, t=NOW))))
    _same_order(index, seq)  # every column: the rows of the refresh, rank 5 still unknown
    assert [r.status for r in index.every_row() if r.rank == 5] == ["unknown"]
    _same_order(index, index.refresh(NOW))
    assert [r.status for r in index.every_row() if r.rank == 5] != ["unknown"]


@settings(max_examples=80, deadline=None)
@given(streams)
def test_odd_view_lists_every_marked_rank_then_groups_the_rest(stream: list[tuple[Event, bool]]) -> None:
    model = JobModel()
    index = RowIndex(model, view="odd")
    for event, _ in stream:
        model.apply(event)
    shown = list(index.refresh(NOW))
    expected = build_rows(model, NOW)
    marked = {r.rank for r in expected if r.marks}
    odd = [r for r in shown if isinstance(r, RankRow)]
    assert {r.rank for r in odd} == marked and shown[:len(odd)] == odd
    groups = [g for g in shown if isinstance(g, GroupRow)]
    assert sum(g.count for g in groups) + len(odd) == len(expected)
    assert {r.rank: r for r in expected if r.marks} == {r.rank: r for r in odd}


def _range(values: list[int | None]) -> tuple[int | None, int | None]:
    present = [v for v in values if v is not None]
    return (min(present), max(present)) if present else (None, None)


def _groups_sum_their_members(shown: list[RankRow | GroupRow], rows: dict[int, RankRow]) -> None:
    for group in (g for g in shown if isinstance(g, GroupRow)):
        members = [rows[r] for r in group.ranks]
        assert group.status_counts == dict(Counter(r.status for r in members)), group
        assert (group.step_lo, group.step_hi) == _range([r.step for r in members]), group
        assert (group.seq_lo, group.seq_hi) == _range([r.seq for r in members]), group
        waiting = [r for r in members if r.pending_seq is not None]
        if group.pending:
            lo, hi = _range([r.pending_seq for r in waiting])
            assert len(waiting) == len(members), group
            assert group.pending.endswith(f"#{lo}" if lo == hi else f"#{lo}-{hi}"), group
            assert group.oldest_wait_s == max(r.pending_age_s or 0.0 for r in waiting), group
        marks = [m for r in sorted(members, key=lambda r: r.rank) for m in r.marks]
        assert group.marks == list(dict.fromkeys(marks)), group


GROUP_VIEWS = ("odd", "node", "status", "collective")


@settings(max_examples=80, deadline=None)
@given(streams, st.lists(st.sampled_from(["absorb"] * 6 + ["nothing"] * 4 + [*GROUP_VIEWS, "ranks"]),
                         min_size=60, max_size=60))
def test_group_rows_sum_their_members_rows(stream: list[tuple[Event, bool]], doings: list[str]) -> None:
    """A group row's counts and ranges are those of its members' rows: the ranges kept from the
    ranks as they fold (absorb() between refreshes, as the app does), in whichever view is shown
    (switching views counts the new kind from scratch)."""
    model = JobModel()
    index = RowIndex(model, view="odd")
    for (event, read), doing in zip(stream, doings, strict=False):
        model.apply(event)
        if doing == "absorb":
            index.absorb()
        elif doing != "nothing":
            index.view = doing
        if read:
            shown = list(index.refresh(NOW))
            _groups_sum_their_members(shown, {r.rank: r for r in build_rows(model, NOW)})
    index.absorb()
    for view in GROUP_VIEWS:
        index.view = view
        shown = list(index.refresh(NOW + 10.0))
        _groups_sum_their_members(shown, {r.rank: r for r in build_rows(model, NOW + 10.0)})


def test_odd_rank_first_and_groups_expand() -> None:
    model = JobModel()
    for r in range(40):
        odd = r == 17
        model.apply(RecordEntry(time=NOW, rank=r, message=StateMsg(state=state(
            r, op="gloo:all_gather" if odd else "gloo:all_reduce", op_seq=301, world=40,
            host=f"node-{r // 8}"))))
    index = RowIndex(model)
    shown = index.refresh(NOW)
    first = shown[0]
    assert isinstance(first, RankRow) and first.rank == 17 and "MISMATCH" in first.marks
    group = shown[1]
    assert isinstance(group, GroupRow) and group.count == 39 and group.pending == "all_reduce #301"
    assert group.status_counts == {"running": 39}
    index.toggle(("rest", *group.key))
    shown = index.refresh(NOW)
    assert len(shown) == 41 and shown.index_of(18) == 19 and shown.index_of(17) == 0
    assert [index.cycle() for _ in range(5)] == ["node", "status", "collective", "ranks", "odd"]
    index.view = "node"
    nodes = list(index.refresh(NOW))
    assert [g.key for g in nodes if isinstance(g, GroupRow)] == [(f"node-{i}",) for i in range(5)]


def test_app_at_2048_ranks_odd_first_views_cycle_and_groups_expand() -> None:
    """The real app above GROUP_FROM_RANKS: the odd rank is the first row, ``g`` cycles the
    views, Enter on a group row expands it in place."""
    from tests.probes_tui.fakes import FakeSource, entries
    from tests.test_tui_app import SIZE, table_lines, until

    n, odd = 2048, 1234
    states = [state(r, op="gloo:all_gather" if r == odd else "gloo:all_reduce", op_seq=301, world=n,
                    host=f"node-{r // 8:03d}") for r in range(n)]

    async def go() -> None:
        app = DdptopApp(FakeSource(entries(states)), clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(RankTable)

            def first_two() -> tuple[object, object] | None:
                rows = table.shown_rows
                return (rows[0], rows[1]) if len(app.model.ranks) == n and len(rows) >= 2 else None

            await until(pilot, lambda: (two := first_two()) is not None and isinstance(two[0], RankRow)
                        and two[0].rank == odd and isinstance(two[1], GroupRow) and two[1].count == n - 1, 30)
            lines = table_lines(app)
            assert lines[1].split()[0] == str(odd) and "MISMATCH" in lines[1]
            assert "2,047 ranks" in lines[2] and "all_reduce #301" in lines[2]
            for view in ("node", "status", "collective", "ranks", "odd"):
                await pilot.press("g")
                await until(pilot, lambda v=view: app._index is not None and app._index.view == v, 10)
            await until(pilot, lambda: len(table.shown_rows) == 2, 10)
            await pilot.press("down")
            await pilot.press("enter")
            await until(pilot, lambda: len(table.shown_rows) == 2 + n - 1, 10)
            assert isinstance(table.current_row, GroupRow) and table.current_row.expanded
            assert table.shown_rows.index_of(0) == 2 if isinstance(table.shown_rows, RowSequence) else False

    asyncio.run(go())


class _DigestLane:
    """Synthetic ranks through real node digests (DigestBuilder -> DigestView) into one model,
    and the same states whole into another: the reference."""

    def __init__(self, fake: FakeRanks, t0: float) -> None:
        self.fake = fake
        self.builders = [DigestBuilder(f"node-{n}") for n in range(fake.n_nodes)]
        self.views = [DigestView() for _ in self.builders]
        self.lane, self.whole = JobModel(), JobModel()
        for n, builder in enumerate(self.builders):
            catch_up = [RecordEntry(time=t0, rank=r, message=StateMsg(state=fake.state(r, 0)))
                        for r in fake.node_ranks(n)]
            builder.seed(catch_up)
            for entry in catch_up:
                self.views[n].whole(entry)
                self.lane.apply(entry)
                self.whole.apply(entry)

    def node_tick(self, n: int, tick: int, now: float) -> None:
        """Node *n*'s states of *tick* (its silent ranks send none): whole into the reference,
        through its digest into the lane."""
        builder = self.builders[n]
        for r in self.fake.node_ranks(n):
            if self.fake.heard_tick(r, tick) != tick:
                continue  # silent: no state this tick
            entry = RecordEntry(time=now, rank=r, message=StateMsg(state=self.fake.state(r, tick)))
            self.whole.apply(entry)
            assert not builder.add(entry)
        events, repair = self.views[n].expand(builder.flush(now), 0.0)
        assert repair == []
        for event in events:
            self.lane.apply(event)


@pytest.mark.parametrize(("scenario", "gpu"), [("healthy", True), ("hang", False), ("desync", True),
                                              ("silent", False)])
def test_rows_from_pulses_not_merged_equal_rows_from_whole_states(scenario: str, gpu: bool) -> None:
    """The digest lane's model keeps pulses unmerged (JobModel, PulseBatch) and the index reads
    them as they are: its rows equal build_rows over a model fed the same states whole."""
    t0 = NOW - 20.0
    digest = _DigestLane(FakeRanks(64, "j", scenario, 1.0, t0, desync_after_s=3.0, fake_gpu=gpu), t0)
    index = RowIndex(digest.lane, view="ranks")
    for tick in range(1, 9):
        now = t0 + tick
        for n in range(digest.fake.n_nodes):
            digest.node_tick(n, tick, now)
        assert any(v.pulse is not None for v in digest.lane.ranks.values())
        assert _rows(index, now) == build_rows(digest.whole, now), tick
        _same_order(index, index.refresh(now))


@pytest.mark.parametrize("scenario", ["healthy", "hang", "desync", "silent"])
def test_group_rows_from_pulses_sum_their_members_rows(scenario: str) -> None:
    """Through the digest lane (a rank's usual change is a pulse over the same detail: the
    row index's shortest path), absorbed as the app does, views switched every three ticks: every
    group row's ranges equal its members' rows from whole states."""
    t0 = NOW - 20.0
    digest = _DigestLane(FakeRanks(64, "j", scenario, 1.0, t0, desync_after_s=3.0), t0)
    index = RowIndex(digest.lane, view="odd")
    for tick in range(1, 13):
        now = t0 + tick
        # Three ticks a view: ranges kept from the ranks that moved, then counted anew.
        index.view = GROUP_VIEWS[tick // 3 % len(GROUP_VIEWS)]
        for n in range(digest.fake.n_nodes):
            digest.node_tick(n, tick, now)
            index.absorb()
        shown = list(index.refresh(now))
        assert any(isinstance(g, GroupRow) for g in shown)
        _groups_sum_their_members(shown, {r.rank: r for r in build_rows(digest.whole, now)})


def test_the_odd_views_rest_group_leaves_its_odd_ranks_out_of_its_ranges() -> None:
    """An odd rank listed on its own (here its loader's length differs) shares the rest group's
    key (same status, same collective) but not its row: the group's step range is the others'."""
    model = JobModel()
    for r in range(40):
        model.apply(RecordEntry(time=NOW, rank=r, message=StateMsg(state=state(
            r, step=50 if r == 17 else 100, bpe=57 if r == 17 else 64, world=40))))
    index = RowIndex(model, view="odd")
    shown = list(index.refresh(NOW))
    assert isinstance(shown[0], RankRow) and shown[0].rank == 17
    rest = shown[1]
    assert isinstance(rest, GroupRow) and rest.count == 39 and (rest.step_lo, rest.step_hi) == (100, 100)


def test_a_group_painted_after_its_odd_rank_moved_leaves_out_where_it_is_now() -> None:
    """The odd view's rest groups leave the odd ranks' values out of their ranges; an odd rank
    that moves after the refresh (absorbed, as every pulse is) is left out where it is now, not
    where it was when the first group was painted (a KeyError on the screen, seen at 32,768
    ranks on a busy node while scrolling between paints)."""
    model = JobModel()

    def fold(r: int, seq: int) -> None:
        odd, op = r == 25, "gloo:all_reduce" if r >= 20 else None
        model.apply(RecordEntry(time=NOW, rank=r, message=StateMsg(state=state(
            r, step=100, seq=seq, bpe=57 if odd else 64, op=op, op_seq=seq + 1 if op else None, world=40))))

    for r in range(40):
        fold(r, 290 if r == 25 else 300)
    index = RowIndex(model, view="odd")
    shown = index.refresh(NOW)
    assert isinstance(shown[0], RankRow) and shown[0].rank == 25
    computing = shown[1]  # painted (its ranges counted) before the odd rank moves
    assert isinstance(computing, GroupRow) and computing.count == 20
    fold(25, 291)
    index.absorb()
    waiting = shown[2]  # then the screen scrolls to this one
    assert isinstance(waiting, GroupRow) and waiting.count == 19
    assert (waiting.seq_lo, waiting.seq_hi) == (300, 300) and (waiting.step_lo, waiting.step_hi) == (100, 100)
