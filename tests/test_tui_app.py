"""Pilot tests of DdptopApp with fake sources and a frozen clock (fast, no jobs)."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from textual import events
from textual.message import Message
from textual.pilot import Pilot
from textual.widgets import Static

from ddptop.bundle.format import SCHEMA_VERSION, Manifest
from ddptop.bundle.replay_source import ReplaySource
from ddptop.bundle.writer import BundleWriter
from ddptop.client.collector import GC_THRESHOLD_0
from ddptop.model.job import JobModel
from ddptop.tui.app import (
    BACKGROUND_FINDINGS_RANKS,
    SLOW_REDRAW_FROM_RANKS,
    SLOW_REDRAW_S,
    UI_SWITCH_INTERVAL_S,
    DdptopApp,
)
from ddptop.tui.event_buffer import MAX_PENDING
from ddptop.tui.screens.detail import RankDetail
from ddptop.tui.screens.stacks import StacksScreen
from ddptop.tui.widgets.findings_panel import FindingsPanel
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.timeline import Timeline
from tests.probes_tui.fakes import NOW, FakeSource, entries, lost, stack, state

SIZE = (160, 45)


async def until(pilot: Pilot[int], cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Bounded wait for *cond* while the app runs."""
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not met within the timeout")


def _whole_json(path: Path) -> bool:
    """Whether *path* is a whole JSON document (written, not being written)."""
    if path.suffix != ".json":
        return False
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


def table_lines(app: DdptopApp) -> list[str]:
    """Rendered text of every visible line of the rank table."""
    table = app.query_one(RankTable)
    return [table.render_line(y).text for y in range(table.size.height)]


def mismatch_job() -> FakeSource:
    states = [state(r, op="gloo:all_reduce", op_seq=50, stuck=True) for r in (0, 2, 3)]
    states.append(state(1, op="gloo:all_gather", op_seq=50, stuck=True, bpe=57))
    stacks = {r: stack(r, ["main", "train_step", "backward", "all_reduce"]) for r in (0, 2, 3)}
    stacks[1] = stack(1, ["main", "save_checkpoint", "all_gather"])
    return FakeSource(entries(states), stacks)


def test_rows_header_findings_with_frozen_clock() -> None:
    async def go() -> None:
        app = DdptopApp(mismatch_job(), clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.query_one(RankTable).shown_rows) == 4)
            # The culprit's row leads (#45): rank 1, the cause; then every rank in order
            await until(pilot, lambda: "CAUSE ⚠ MISMATCH" in "".join(table_lines(app)[1:2]))
            lines = table_lines(app)
            assert lines[0].split()[:3] == ["RANK▲", "HOST", "STATUS"]
            assert [line.split()[0] for line in lines[1:5]] == ["1", "0", "2", "3"]
            assert "CAUSE ⚠ MISMATCH BA…" in lines[1]  # the column cuts the marks that follow
            assert "VICTIM" in lines[2] and "all_reduce #50 12.0s" in lines[2]
            header = str(app.query_one("#header", Static).render())
            assert "job jfake" in header and "4 ranks" in header and "gloo" in header
            assert "up 1m30s" in header and "connected 4/4" in header and "CRITICAL" in header
            assert gc.get_threshold()[0] == GC_THRESHOLD_0  # no full-collection pauses at scale
            # Held off while the job attached; running again once every rank is in.
            await until(pilot, lambda: not app.collector.held)
            assert gc.isenabled() and not app.collector.frozen  # 4 ranks: nothing to freeze
            findings = str(app.query_one("#findings", Static).render())
            # Text comes from the diagnosis package when present, else from the fallback.
            assert "CRITICAL" in findings and "all_gather" in findings
        assert app.source.stopped  # type: ignore[attr-defined]
        assert gc.get_threshold() == before  # the collector tuning ends with the app

    before = gc.get_threshold()
    asyncio.run(go())


def test_a_tick_while_the_widgets_go_one_by_one_draws_nothing() -> None:
    """Shutting down, Textual removes the widgets before the timers: a tick that finds the
    table but no findings panel (seen at 32,768 ranks) must not raise into the teardown."""
    async def go() -> None:
        app = DdptopApp(mismatch_job(), clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.query_one(RankTable).shown_rows) == 4)
            drawn = app.redraws
            await app.query_one(FindingsPanel).remove()
            app._dirty = True
            app._tick()  # raised NoMatches before the guard
            assert app.redraws == drawn

    asyncio.run(go())


def test_sort_filter_and_lost_rank() -> None:
    async def go() -> None:
        src = FakeSource(entries([state(r, step=100 - r * 10) for r in range(4)]))
        app = DdptopApp(src, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(RankTable)
            await until(pilot, lambda: len(table.shown_rows) == 4)
            for _ in range(4):  # rank -> host -> status -> flags -> step
                await pilot.press("greater_than_sign")
            assert table.sort_key == "step"
            assert [r.rank for r in table.shown_rows] == [3, 2, 1, 0]
            await pilot.press("o")
            assert [r.rank for r in table.shown_rows] == [0, 1, 2, 3]
            await pilot.press("less_than_sign")
            assert table.sort_key == "flags"
            await pilot.press("slash")
            await pilot.press(*"1-2", "enter")
            await until(pilot, lambda: [r.rank for r in table.shown_rows] == [1, 2])
            await pilot.press("slash", "ctrl+u", "enter")  # empty clears
            await until(pilot, lambda: len(table.shown_rows) == 4)
            assert src.emit is not None
            src.emit(lost(2))
            await until(pilot, lambda: {r.rank: r.status for r in table.shown_rows}.get(2) == "lost")
            await until(pilot, lambda: any("lost" in line and "⚠ LOST" in line for line in table_lines(app)))

    asyncio.run(go())


def test_stacks_screen_groups_selected_or_all() -> None:
    async def go() -> None:
        src = mismatch_job()
        app = DdptopApp(src, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.query_one(RankTable).shown_rows) == 4)
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, StacksScreen) and app.screen.result is not None)
            text = str(app.screen.query_one("#stacks-text", Static).render())
            assert "ranks 0,2-3: all_reduce ← backward ← train_step ← train.py:13" in text
            assert "rank 1: all_gather ← save_checkpoint ← main" in text
            await pilot.press("escape")
            await until(pilot, lambda: app.query_one(RankTable).current_rank == 1)  # the culprit leads
            await pilot.press("space")  # select rank 1 only
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, StacksScreen) and app.screen.result is not None)
            assert src.stack_requests[-1] == [1]

    asyncio.run(go())


def test_detail_opens_and_export_writes_json(tmp_path: Path) -> None:
    async def go() -> None:
        app = DdptopApp(mismatch_job(), clock=lambda: NOW, export_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.query_one(RankTable).shown_rows) == 4)
            await until(pilot, lambda: app.query_one(RankTable).current_rank == 1)  # the culprit leads
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RankDetail))
            text = str(app.screen.query_one("#detail-text", Static).render())
            assert "rank 1" in text and "host node-a  pid 1001" in text
            assert "pending gloo:all_gather #50" in text and "step time" in text
            await pilot.press("escape")
            await pilot.press("e")
            await until(pilot, lambda: any(_whole_json(p) for p in tmp_path.iterdir()))
        written = next(tmp_path.iterdir())
        assert written.suffix == ".json"  # a fake source has no ranks to ask: the JSON fallback
        doc = json.loads(written.read_text())
        assert {r["rank"] for r in doc["snapshot"]["ranks"]} == {0, 1, 2, 3}

    asyncio.run(go())


def recording_of_a_lost_rank(path: Path) -> Path:
    """A real recording (the writer ``ddptop record`` uses): four healthy ranks at t0 and
    t0+5; at t0+10 rank 1's connection is lost while the others go on."""
    manifest = Manifest(schema_version=SCHEMA_VERSION, kind="recording", created=NOW - 1, job_id="rp",
                        world_size=4, ddptop_version="test")
    writer = BundleWriter(path, manifest)
    for t in (NOW, NOW + 5):
        for event in entries([state(r, t=t) for r in range(4)], at=t):
            writer.write(event)
    for event in entries([state(r, t=NOW + 10) for r in (0, 2, 3)], at=NOW + 10):
        writer.write(event)
    writer.write(lost(1, NOW + 10))
    writer.close("test")
    return path


def test_replay_timeline_moves_through_a_real_recording(tmp_path: Path) -> None:
    async def go() -> None:
        src = ReplaySource(recording_of_a_lost_rank(tmp_path / "rp.ddptop"))
        app = DdptopApp(src, clock=lambda: 0.0)
        assert app.recording is src  # typed as a replayable source, not guessed
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(RankTable)
            status = lambda: {r.rank: r.status for r in table.shown_rows}.get(1)  # noqa: E731
            await until(pilot, lambda: len(table.shown_rows) == 4 and status() == "lost")
            await pilot.press("home")
            await until(pilot, lambda: status() == "running")
            await pilot.press("f")  # first finding: the lost rank at t0+10
            await until(pilot, lambda: status() == "lost")
            assert app.query_one(Timeline).t >= NOW + 10
            assert "REPLAY" in str(app.query_one("#header", Static).render())

    asyncio.run(go())


def test_a_viewer_that_fell_behind_says_how_many_events_it_dropped() -> None:
    """The event buffer keeps the newest MAX_PENDING events when the UI stalls; the header
    then says how many were lost, since what the table shows lags the job."""
    async def go() -> None:
        source = mismatch_job()
        app = DdptopApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.query_one(RankTable).shown_rows) == 4)
            header = app.query_one("#header", Static)
            assert "dropped" not in str(header.render())
            assert source.emit is not None
            news = entries([state(r, step=101) for r in range(4)])
            # From the UI thread, without yielding: nothing is drained meanwhile (a stalled UI).
            for i in range(MAX_PENDING + 3):
                source.emit(news[i % 4])
            await until(pilot, lambda: "3 events dropped" in str(header.render()))
            assert "viewer behind" in str(header.render())
            assert [r.step for r in app.query_one(RankTable).shown_rows] == [101] * 4  # the newest kept

    asyncio.run(go())


def test_the_background_diagnosis_waits_while_the_ui_is_busy() -> None:
    """A big job is diagnosed on a worker thread; its long passes give way to the UI's busy
    moments (a key, a redraw), as the live source's reads do (ddptop.model.pace)."""
    async def go() -> None:
        n = BACKGROUND_FINDINGS_RANKS + 44
        source = FakeSource(entries([state(r, world=n) for r in range(n)]))
        app = DdptopApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.model.ranks) == n and not app._diagnosing, timeout=30.0)
            before = app.diagnosis_waited_s  # earlier diagnoses may have met a redraw
            with source.foreground.busy():  # a UI busy for the whole diagnosis
                app.redraw(fresh_findings=True)  # starts one: nothing else is diagnosing
                assert app._diagnosing
                await until(pilot, lambda: not app._diagnosing, timeout=60.0)
            assert app.diagnosis_waited_s > before

    asyncio.run(go())


def test_a_key_goes_between_the_slices_of_the_background_diagnosis_s_copy() -> None:
    """The diagnosis's copy of a big job is taken a slice of ranks per message: a key pressed
    while it is taken is handled before the copy is done (tests/test_sliced_copy.py: the copy
    is the model of its last slice), and the diagnosis then runs as before."""
    async def go() -> None:
        n = BACKGROUND_FINDINGS_RANKS + 44
        source = FakeSource(entries([state(r, world=n) for r in range(n)]))
        app = DdptopApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(RankTable)
            await until(pilot, lambda: len(app.model.ranks) == n and not app._diagnosing, timeout=30.0)
            app.copy_slice_ranks = 64  # five slices and the last step
            copying: list[bool] = []
            move = table.action_cursor

            def spied(delta: int) -> None:
                copying.append(app._copying is not None)
                move(delta)
            table.action_cursor = spied  # type: ignore[method-assign]
            app.redraw(fresh_findings=True)  # its first slice now, the others queued one by one
            copier = app._copying
            assert app._diagnosing and copier is not None and copier.steps == 1
            key = events.Key("down", None)
            key.set_sender(app)
            app.post_message(key)
            await until(pilot, lambda: not app._diagnosing, timeout=60.0)
            assert copying == [True] and table.cursor == 1
            assert copier.steps == 6 and not copier.watching and app._copying is None

    asyncio.run(go())


def test_no_automatic_collection_while_the_background_diagnosis_holds_its_copy() -> None:
    """The diagnosis's copy of a big job is freed by reference counting when it returns: the
    collector is paused from its first slice until then (ddptop.client.collector), and after."""
    async def go() -> None:
        n = BACKGROUND_FINDINGS_RANKS + 44
        source = FakeSource(entries([state(r, world=n) for r in range(n)]))
        was_enabled = gc.isenabled()
        app = DdptopApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.model.ranks) == n and not app._diagnosing
                        and not app.collector.held, timeout=30.0)
            assert gc.isenabled() == was_enabled and not app.collector.paused
            app.copy_slice_ranks = 64  # five slices and the last step
            app.redraw(fresh_findings=True)  # its first slice now
            assert app._copying is not None and app.collector.paused and not gc.isenabled()
            await until(pilot, lambda: not app._diagnosing, timeout=60.0)
            assert not app.collector.paused and gc.isenabled() == was_enabled

    asyncio.run(go())


def test_a_key_holds_the_ui_busy_from_its_arrival_until_its_repaint() -> None:
    """A move key's action is not a busy block of its own, yet the threads that give way
    (the source's, the background diagnosis) wait through it: the key holds the UI from its
    arrival until the screen shows it, then lets go."""
    async def go() -> None:
        source = mismatch_job()
        app = DdptopApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(RankTable)
            await until(pilot, lambda: len(table.shown_rows) == 4)
            seen: list[bool] = []
            move = table.action_cursor

            def spied(delta: int) -> None:
                seen.append(source.foreground.is_busy)
                move(delta)
            table.action_cursor = spied  # type: ignore[method-assign]
            before = source.foreground.key_released_at
            await pilot.press("down")
            await until(pilot, lambda: not source.foreground.is_busy)
            assert seen == [True] and table.cursor == 1
            assert source.foreground.key_released_at > before  # a key: the diagnosis lingers after it

    asyncio.run(go())


def test_events_that_come_while_a_key_is_on_its_way_are_folded_once_it_is_shown() -> None:
    """The UI's upkeep waits for a person's key (ddptop.tui.key_first): events that arrive while
    a key is on its way stay in the buffer, and are all folded after its repaint."""
    async def go() -> None:
        source = mismatch_job()
        app = DdptopApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(RankTable)
            await until(pilot, lambda: len(table.shown_rows) == 4)
            assert source.emit is not None
            emit, model = source.emit, app.model
            keys_on_their_way: list[int] = []  # at each event folded
            apply = model.apply

            def spied_apply(event: object, *inner: object) -> None:
                if not inner:  # the fold's call (a RecordEntry applies its message again)
                    keys_on_their_way.append(app.key_first.in_flight)
                apply(event, *inner)  # type: ignore[arg-type]
            model.apply = spied_apply  # type: ignore[method-assign]
            move = table.action_cursor

            def spied(delta: int) -> None:
                for event in entries([state(r, step=2000) for r in range(4)]):
                    emit(event)  # wakes the app: its fold is queued behind this key
                move(delta)
            table.action_cursor = spied  # type: ignore[method-assign]
            await pilot.press("down")
            await until(pilot, lambda: all(v.base is not None and v.base.step == 2000
                                           for v in model.ranks.values()))
            assert table.cursor == 1
            assert app.key_first.put_off >= 1  # the fold came while the key was on its way, and waited
            assert len(keys_on_their_way) == 4 and set(keys_on_their_way) == {0}

    asyncio.run(go())


def test_while_the_app_runs_a_waiting_thread_gets_the_interpreter_within_a_millisecond() -> None:
    """The UI thread waits for the interpreter at each await of a key's way through Textual
    while another thread works: 1 ms at most while the app runs, the interpreter's own after."""
    async def go() -> None:
        app = DdptopApp(mismatch_job(), clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.query_one(RankTable).shown_rows) == 4)
            assert sys.getswitchinterval() == UI_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # CPython's default, whatever an earlier test left
    try:
        asyncio.run(go())
        assert sys.getswitchinterval() == 0.005
    finally:
        sys.setswitchinterval(before)


def test_the_background_diagnosis_s_copy_is_freed_when_it_returns() -> None:
    """The worker diagnoses a copy of the model (at 32,768 ranks, 32,768 views and their
    merged states): freed by reference counting when the diagnosis returns, not left to the
    cyclic collector."""
    async def go() -> None:
        n = BACKGROUND_FINDINGS_RANKS + 44
        app = DdptopApp(FakeSource(entries([state(r, world=n) for r in range(n)])), clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.model.ranks) == n and not app._diagnosing, timeout=30.0)
            gc.collect()
            was_enabled = gc.isenabled()
            gc.disable()  # only reference counting frees the copy here
            try:
                # type(), not isinstance: torch's deprecated module proxies warn when asked.
                before = {id(o) for o in gc.get_objects() if type(o) is JobModel}
                app.redraw(fresh_findings=True)
                assert app._diagnosing
                await until(pilot, lambda: not app._diagnosing, timeout=60.0)
                left = [o for o in gc.get_objects() if type(o) is JobModel and id(o) not in before]
                assert left == []
            finally:
                if was_enabled:
                    gc.enable()

    asyncio.run(go())


class _Probe(Message):
    """Posted after a backlog of events: handled after the first slice of it, not the whole."""


class _ProbedApp(DdptopApp):
    CSS_PATH = str(Path(sys.modules[DdptopApp.__module__].__file__ or "").parent / DdptopApp.CSS_PATH)
    folded_at_probe: int | None = None

    unabsorbed_at_probe: int | None = None

    def on__probe(self, _message: _Probe) -> None:
        self.folded_at_probe = sum(v.base.step for v in self.model.ranks.values() if v.base is not None)
        if self._index is not None:
            self.unabsorbed_at_probe = len(self._index._dirty)


def test_a_message_behind_a_backlog_is_handled_after_a_slice_of_it_and_nothing_is_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The UI folds waiting events in slices (FOLD_SLICE_S), each a message of its own: a key
    that comes behind a backlog waits for one slice, and every event is still folded, in order."""
    import ddptop.tui.app as app_module

    monkeypatch.setattr(app_module, "FOLD_SLICE_S", 0.0)  # a slice of 16 events, whatever the machine

    async def go() -> None:
        source = mismatch_job()
        app = _ProbedApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.query_one(RankTable).shown_rows) == 4)
            assert source.emit is not None
            backlog = entries([state(r, step=1000 + i) for i in range(400) for r in range(4)])
            for event in backlog:  # from the UI thread, without yielding: a backlog
                source.emit(event)
            app.post_message(_Probe())
            done = 4 * 1399  # every rank's last step
            await until(pilot, lambda: app.folded_at_probe is not None
                        and sum(v.base.step for v in app.model.ranks.values() if v.base) == done)
            assert app.folded_at_probe is not None and app.folded_at_probe < done  # not after the whole
            # In order: each rank's newest state last, as the table shows at its next redraw.
            await until(pilot, lambda: [r.step for r in app.query_one(RankTable).shown_rows] == [1399] * 4)

    asyncio.run(go())


def test_a_message_behind_a_slice_goes_before_the_row_index_absorbs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the row index (big jobs: here from 2 ranks on), a slice of folding is followed by
    the index's absorb as a message of its own, queued behind what came meanwhile: a key
    pressed during a slice waits for the folding only. Nothing is left unabsorbed after."""
    import ddptop.tui.app as app_module

    monkeypatch.setattr(app_module, "FOLD_SLICE_S", 0.0)  # a slice of 16 events, whatever the machine
    monkeypatch.setattr(app_module, "GROUP_FROM_RANKS", 2)

    async def go() -> None:
        source = mismatch_job()
        app = _ProbedApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app._index is not None and len(app.model.ranks) == 4)
            assert source.emit is not None and app._index is not None
            backlog = entries([state(r, step=1000 + i) for i in range(400) for r in range(4)])
            for event in backlog:  # from the UI thread, without yielding: a backlog
                source.emit(event)
            app.post_message(_Probe())
            done = 4 * 1399
            await until(pilot, lambda: sum(v.base.step for v in app.model.ranks.values() if v.base) == done
                        and not app._index._dirty)
            assert app.folded_at_probe is not None and app.folded_at_probe < done  # after one slice
            assert app.unabsorbed_at_probe  # before that slice's absorb

    asyncio.run(go())


def test_a_job_of_tens_of_thousands_of_ranks_is_redrawn_every_half_second() -> None:
    """From SLOW_REDRAW_FROM_RANKS ranks on (known or announced by world_size) a changed job is
    redrawn every SLOW_REDRAW_S, not every redraw interval; a smaller one as often as asked."""
    app = DdptopApp(FakeSource([]), redraw_interval=0.25)
    assert app.redraw_period() == 0.25
    app.model.world_size = SLOW_REDRAW_FROM_RANKS - 1
    assert app.redraw_period() == 0.25
    app.model.world_size = SLOW_REDRAW_FROM_RANKS
    assert app.redraw_period() == SLOW_REDRAW_S == 0.5
    slow = DdptopApp(FakeSource([]), redraw_interval=2.0)
    slow.model.world_size = SLOW_REDRAW_FROM_RANKS
    assert slow.redraw_period() == 2.0  # never more often than asked
    assert slow.quiet_toasts() and not DdptopApp(FakeSource([])).quiet_toasts()  # sort keys: no toast


def test_a_sort_key_toasts_in_a_small_job_and_the_title_marks_the_column() -> None:
    """Below SLOW_REDRAW_FROM_RANKS ranks a sort key confirms itself with a toast; the sorted
    column's title carries ▲ (▼ descending) at any size."""

    async def go() -> None:
        app = DdptopApp(mismatch_job(), clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.query_one(RankTable).shown_rows) == 4)
            await pilot.press("greater_than_sign")
            table = app.query_one(RankTable)
            assert table.sort_key != "rank"
            await until(pilot, lambda: any(f"sorted by {table.sort_key}" in str(n.message)
                                           for n in app._notifications))
            assert "▲" in table.render_line(0).text

    asyncio.run(go())
