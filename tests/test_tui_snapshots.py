"""SVG snapshots of the dashboard's main screens: a visual change fails until it is accepted.

Every picture is of real data: the F5 job (unseeded split, collective mismatch at the
checkpoint save) as ``ddptop export`` saved it, hanging (``tests/data/f5_hang.ddptop``) and
dead (``tests/data/f5_record.ddptop``); ``tests/data/make_snapshot_recording.py`` makes both.
The live screens run with the app's clock frozen at the moment of the export, replay runs
at a recorded moment, and the timeline's wall-clock time is shown in UTC: nothing depends
on when, where or how fast the test runs.

A failing test means the dashboard renders differently: look at the HTML report the plugin
names (written under the system temp dir, see ``conftest.py``); if the change is wanted,
accept it with ``pytest tests/test_tui_snapshots.py --snapshot-update`` and commit the SVGs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot

from ddptop.bundle.replay_source import ReplaySource
from ddptop.tui.app import DdptopApp
from ddptop.tui.screens.detail import RankDetail
from ddptop.tui.screens.stacks import StacksScreen
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.timeline import Timeline
from tests.probes_tui.recorded import RecordedJob

DATA = Path(__file__).resolve().parent / "data"
HANG = DATA / "f5_hang.ddptop"
RECORD = DATA / "f5_record.ddptop"
SIZE = (120, 36)
WAIT_S = 30.0  # bounded waits, generous: the suite shares two cores with torchrun jobs

SnapCompare = Callable[..., bool]


@pytest.fixture(autouse=True)
def same_picture_everywhere(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The timeline prints local time and Textual drops colour under NO_COLOR: pin both."""
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("NO_COLOR", raising=False)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


async def until(pilot: Pilot[int], cond: Callable[[], bool], what: str) -> None:
    """Bounded wait for *cond* while the app runs."""
    for _ in range(int(WAIT_S / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {WAIT_S:g}s waiting for {what}")


def live_app(path: Path) -> DdptopApp:
    """The dashboard in live mode on a recorded job, its clock at the moment of the export."""
    job = RecordedJob(path)
    return DdptopApp(job, clock=job.clock)


def table_of(pilot: Pilot[int]) -> RankTable:
    """The rank table of the main screen."""
    return pilot.app.query_one(RankTable)


async def all_ranks_shown(pilot: Pilot[int]) -> None:
    """Wait for the first redraw after the recording was folded: the final picture (see RecordedJob)."""
    await until(pilot, lambda: len(table_of(pilot).shown_rows) == 4, "the 4 ranks")


def test_rank_table(snap_compare: SnapCompare) -> None:
    """Main screen of the hanging job: rank 1 in all_gather, the others in all_reduce, at #96."""
    assert snap_compare(live_app(HANG), terminal_size=SIZE, run_before=all_ranks_shown)


def test_rank_detail(snap_compare: SnapCompare) -> None:
    """Enter on rank 1, the one that went to save: its pending all_gather, loaders, env. The
    table leads with the culprit's row (#45): enter on the first row opens it."""

    async def open_rank_1(pilot: Pilot[int]) -> None:
        await all_ranks_shown(pilot)
        table = pilot.app.query_one(RankTable)
        await until(pilot, lambda: table.shown_rows[0].rank == 1, "the culprit's row first")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(pilot.app.screen, RankDetail), "the detail screen")
        assert isinstance(pilot.app.screen, RankDetail) and pilot.app.screen.rank == 1

    assert snap_compare(live_app(HANG), terminal_size=SIZE, run_before=open_rank_1)


def test_stacks(snap_compare: SnapCompare) -> None:
    """`s`: the stacks the export took, grouped: ranks 0,2-3 in backward, rank 1 in all_gather."""

    async def open_stacks(pilot: Pilot[int]) -> None:
        await all_ranks_shown(pilot)
        await pilot.press("s")
        await until(pilot, lambda: isinstance(pilot.app.screen, StacksScreen)
                    and pilot.app.screen.result is not None, "the stacks")
        # The "stacks of 4 rank(s)" toast goes away on a timer: whether it is still up when
        # the picture is taken would depend on the machine's load. The title says the same.
        pilot.app.clear_notifications()

    assert snap_compare(live_app(HANG), terminal_size=SIZE, run_before=open_stacks)


def test_findings_of_a_dead_job(snap_compare: SnapCompare) -> None:
    """The findings panel after the job died of the mismatch: which collective differed, which
    rank failed first, with evidence and remedies; every rank crashed in the table."""

    async def ended(pilot: Pilot[int]) -> None:
        await all_ranks_shown(pilot)
        assert {r.status for r in table_of(pilot).shown_rows} == {"crashed"}

    assert snap_compare(live_app(RECORD), terminal_size=SIZE, run_before=ended)


async def at_first_finding(pilot: Pilot[int]) -> None:
    """Replay: `f`, then wait until the app has loaded that moment."""
    source = pilot.app.source
    assert isinstance(source, ReplaySource)
    first = source.first_finding_time()
    assert first is not None and source.start_time < first < source.end_time
    await pilot.press("f")
    # model_at(t) moves the source's position; the app redraws right after loading that moment.
    await until(pilot, lambda: source.position == first, "the first finding's moment")
    assert pilot.app.query_one(Timeline).t == first
    pilot.app.clear_notifications()  # "jumped to the first finding": a toast on a timer


def test_replay_at_the_first_finding(snap_compare: SnapCompare) -> None:
    """Replay of the black box at its first finding (the unequal batch counts, long before
    the hang): the timeline's position, the REPLAY header, the findings of that moment."""
    assert snap_compare(DdptopApp(ReplaySource(RECORD)), terminal_size=SIZE, run_before=at_first_finding)
