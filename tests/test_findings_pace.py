"""When the dashboard diagnoses again: FindingsPace, pure (the clock passed in), and the app's
wiring of it: a rank whose status word changes in a big job is diagnosed before the pace's
usual interval, on a condition, not on time."""

from __future__ import annotations

import asyncio
import time

from ddptop.tui.app import DdptopApp
from ddptop.tui.findings import EARLY_SHARE, FINDINGS_EVERY_S, SHARE, FindingsPace
from ddptop.tui.row_index import GROUP_FROM_RANKS
from tests.probes_tui.fakes import NOW, FakeSource, entries, lost, state
from tests.test_tui_app import SIZE, until

RUNNING = {"running": 10}


def test_first_diagnosis_is_due_and_then_once_a_second_inline() -> None:
    pace = FindingsPace()
    assert pace.due(0.0, 10, RUNNING)
    pace.began(0.0, 10, RUNNING)
    assert not pace.due(FINDINGS_EVERY_S - 0.01, 10, RUNNING)
    assert pace.due(FINDINGS_EVERY_S, 10, RUNNING)


def test_a_background_diagnosis_takes_a_share_of_the_time() -> None:
    pace = FindingsPace()
    pace.began(100.0, 10, RUNNING)
    pace.took(2.0)
    assert not pace.due(100.0 + SHARE * 2.0 - 0.01, 10, RUNNING)
    assert pace.due(100.0 + SHARE * 2.0, 10, RUNNING)


def test_new_ranks_are_due_at_once() -> None:
    pace = FindingsPace()
    pace.began(100.0, 10, RUNNING)
    pace.took(2.0)
    assert pace.due(100.1, 11, RUNNING)


def test_a_changed_status_word_is_due_after_the_early_share_only() -> None:
    pace = FindingsPace()
    pace.began(100.0, 10, RUNNING)
    pace.took(2.0)
    one_stale = {"running": 9, "stale": 1}
    early = 100.0 + EARLY_SHARE * 2.0
    assert not pace.due(early - 0.01, 10, one_stale)
    assert pace.due(early, 10, one_stale)
    assert not pace.due(early, 10, RUNNING)  # nothing new
    assert not pace.due(early, 10, {"running": 7, "starting": 3, "stale": 0})  # not news either
    assert not pace.due(early, 10, None)  # words unknown (the inline path): the usual pace
    pace.began(early, 10, one_stale)
    assert not pace.due(early + EARLY_SHARE * 2.0, 10, one_stale)  # already diagnosed
    assert pace.due(early + EARLY_SHARE * 2.0, 10, {"running": 8, "stale": 1, "lost": 1})


def test_a_big_job_s_rank_that_is_lost_is_diagnosed_before_the_usual_interval() -> None:
    """The app: the last diagnosis began 300 s ago and took 100 s, so the usual pace waits
    for 500 s; a rank lost makes one due at once (past 2 x 100 s), and its finding shows."""
    async def go() -> None:
        n = GROUP_FROM_RANKS + 8  # the row index, and its word counts, serve the table
        source = FakeSource(entries([state(r, world=n) for r in range(n)]))
        app = DdptopApp(source, clock=lambda: NOW)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app._pace.ranks == n and not app._diagnosing, timeout=60.0)
            app._pace.took(100.0)
            app._pace.last = time.monotonic() - 300.0
            began = app._pace.last
            for _ in range(3):  # no word changed: no diagnosis, however often it redraws
                app.redraw()
                assert not app._diagnosing and app._pace.last == began
            assert source.emit is not None
            source.emit(lost(5))
            await until(pilot, lambda: app._pace.words.get("lost") == 1, timeout=30.0)
            assert app._pace.last > began
            await until(pilot, lambda: any(5 in f.ranks for f in app.findings), timeout=60.0)

    asyncio.run(go())
