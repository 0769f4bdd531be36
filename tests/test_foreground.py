"""The UI's busy moments and a source's thread that gives way to them (ddptop.source.Foreground).

A dashboard of 32,768 ranks redraws for tens of milliseconds; Python runs one thread at a time,
so the live source's decoding beside it doubled that. The source's thread waits before each
read while the UI is busy, never longer than the bound, and reads on once the UI is done.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import resolve
from ddptop.client.watch import watching
from ddptop.source import GIVE_WAY_MAX_S, Foreground
from ddptop.testing.synthetic import SyntheticJob
from tests.jobs import wait_until


def _give_way_in_a_thread(fg: Foreground) -> threading.Thread:
    thread = threading.Thread(target=fg.give_way, daemon=True)
    thread.start()
    return thread


def test_a_free_ui_costs_the_source_nothing() -> None:
    fg = Foreground()
    fg.give_way()
    assert fg.gave_way_s == 0.0 and not fg.is_busy


def test_the_source_waits_until_the_ui_is_done() -> None:
    fg = Foreground(max_wait_s=60.0)  # a return well before the bound: the UI's release woke it
    with fg.busy():
        thread = _give_way_in_a_thread(fg)
        wait_until(lambda: fg.waiting, 10.0, "the source's thread waiting")
    thread.join(10.0)
    assert not thread.is_alive() and 0.0 < fg.gave_way_s < 60.0


def test_busy_is_reentrant_the_outer_moment_ends_it() -> None:
    fg = Foreground(max_wait_s=60.0)
    with fg.busy():
        with fg.busy():
            pass
        assert fg.is_busy  # the inner end does not free the source while the outer goes on
        thread = _give_way_in_a_thread(fg)
        wait_until(lambda: fg.waiting, 10.0, "the source's thread waiting")
    thread.join(10.0)
    assert not thread.is_alive() and not fg.is_busy


def test_a_ui_that_stays_busy_cannot_starve_the_source() -> None:
    """Waited out once, the source reads on freely for as long: at worst half its pace."""
    fg = Foreground(max_wait_s=2.0)
    with fg.busy():
        began = time.monotonic()
        fg.give_way()  # on this thread: it returns with the UI still busy
        waited = fg.gave_way_s
        assert fg.is_busy and time.monotonic() - began >= 2.0 and waited >= 2.0
        fg.give_way()  # the free pass: no second wait while the UI is still busy
        assert fg.gave_way_s == waited
    assert GIVE_WAY_MAX_S <= 0.25  # the default: a stalled UI delays frames a quarter second at most


def test_a_live_source_gives_way_before_its_reads(runtime_dir: Path) -> None:
    feed = ModelFeed("fg4", 4)
    with SyntheticJob(4, "fg4", interval_s=0.2, runtime_dir=runtime_dir), \
            watching(resolve("fg4"), feed, token=None) as source:
        assert feed.wait_settled(range(4), 20.0) == 4, "every rank's state"
        with source.foreground.busy():
            wait_until(lambda: source.foreground.waiting, 10.0, "the source's thread giving way")
        read = source.bytes_in
        wait_until(lambda: source.bytes_in > read, 10.0, "reads going on once the UI is done")


def test_another_thread_gives_way_with_its_own_pass_and_count() -> None:
    """The background diagnosis holds a waiter of its own: the source's free pass (after a
    wait the UI outlasted) is not its pass, and its waits are not counted as the source's."""
    fg = Foreground(max_wait_s=0.5)
    diagnosis = fg.waiter()
    with fg.busy():
        fg.give_way()  # the source waits the bound out: it has a free pass now
        waited = fg.gave_way_s
        assert waited >= 0.5
        thread = threading.Thread(target=diagnosis, daemon=True)
        thread.start()
        thread.join(10.0)  # the UI stays busy throughout: the diagnosis waits its own bound out
        assert not thread.is_alive()
    assert diagnosis.gave_way_s >= 0.4 and fg.gave_way_s == waited and not diagnosis.waiting


def test_a_hold_lasts_until_its_release_which_counts_once() -> None:
    """A key holds the UI from its arrival until its repaint (ddptop.tui.table_actions): the
    source waits meanwhile; a second release (the repaint, then the bound's timer) is nothing,
    and a hold nests with busy blocks either way round."""
    fg = Foreground(max_wait_s=60.0)
    release = fg.hold()
    with fg.busy():
        pass
    assert fg.is_busy  # the busy block inside the hold ended: the hold goes on
    thread = _give_way_in_a_thread(fg)
    wait_until(lambda: fg.waiting, 10.0, "the source's thread waiting")
    with fg.busy():
        release()
        release()  # the bound's timer after the repaint: counts nothing
        assert fg.is_busy  # the busy block is still on
    thread.join(10.0)
    assert not thread.is_alive() and not fg.is_busy and 0.0 < fg.gave_way_s < 60.0
    again = fg.hold()
    assert fg.is_busy
    again()
    assert not fg.is_busy


def test_a_waiter_with_a_linger_waits_on_after_a_key_and_only_after_a_key() -> None:
    """The background diagnosis waits until a moment after a person's key was shown (the next
    key of a run finds the UI free of it); a redraw's busy block, or the source's thread, do not
    linger."""
    fg = Foreground(max_wait_s=60.0)
    diagnosis = fg.waiter(linger_s=0.2, max_wait_s=60.0)
    with fg.busy():  # a redraw
        pass
    diagnosis()
    assert diagnosis.gave_way_s == 0.0
    fg.hold(key=True)()  # a key, shown at once
    fg.give_way()  # the source's thread: only while the UI is busy
    assert fg.gave_way_s == 0.0
    diagnosis()
    assert time.monotonic() - fg.key_released_at >= 0.2 and diagnosis.gave_way_s > 0.0
    waited = diagnosis.gave_way_s
    diagnosis()  # the linger is over: no second wait
    assert diagnosis.gave_way_s == waited and not diagnosis.waiting


def test_keys_without_end_cannot_starve_a_lingering_waiter() -> None:
    """Within the linger the whole time, the waiter waits its own bound out, then goes on freely
    for as long (the same rule as for a UI that stays busy)."""
    fg = Foreground(max_wait_s=60.0)
    diagnosis = fg.waiter(linger_s=3600.0, max_wait_s=0.3)
    fg.hold(key=True)()
    began = time.monotonic()
    diagnosis()
    assert time.monotonic() - began >= 0.3 and diagnosis.gave_way_s >= 0.3
    waited = diagnosis.gave_way_s
    diagnosis()  # its free pass
    assert diagnosis.gave_way_s == waited


def test_a_hold_runs_its_then_once_after_the_release() -> None:
    fg = Foreground()
    seen: list[bool] = []
    release = fg.hold(key=True, then=lambda: seen.append(fg.is_busy))
    assert fg.is_busy and seen == []
    release()
    release()  # once counts: the repaint's release and the timer's
    assert seen == [False]
