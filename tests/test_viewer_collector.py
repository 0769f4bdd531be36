"""The viewer's garbage collector policy (ddptop.client.collector), against the real collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from ddptop.client.collector import FREEZE_FROM_RANKS, GC_THRESHOLD_0, HOLD_MAX_S, ViewerCollector


@pytest.fixture
def restored() -> Iterator[None]:
    """Whatever a test does, the process's collector is as it was afterwards."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_held_until_settled_then_a_big_jobs_attach_is_frozen(restored: None) -> None:
    gc.enable()
    before = gc.get_threshold()
    clock = Clock()
    collector = ViewerCollector(clock)
    collector.start()
    assert collector.held and not gc.isenabled() and gc.get_threshold()[0] == GC_THRESHOLD_0
    kept = [[i] for i in range(1000)]  # what an attach keeps
    assert not collector.attached(FREEZE_FROM_RANKS, settled=False)  # still attaching
    assert not gc.isenabled()
    assert collector.attached(FREEZE_FROM_RANKS, settled=True)
    assert gc.isenabled() and collector.frozen and not collector.held
    assert gc.get_freeze_count() >= len(kept)  # the permanent generation holds the attach
    assert not collector.attached(FREEZE_FROM_RANKS, settled=True)  # once
    collector.stop()
    assert gc.get_freeze_count() == 0 and gc.isenabled() and gc.get_threshold() == before


def test_a_small_job_is_released_without_a_freeze(restored: None) -> None:
    gc.enable()
    collector = ViewerCollector(Clock())
    collector.start()
    assert collector.attached(FREEZE_FROM_RANKS - 1, settled=True)
    assert gc.isenabled() and not collector.frozen and gc.get_freeze_count() == 0
    collector.stop()


def test_a_job_that_never_settles_is_released_after_the_longest_hold(restored: None) -> None:
    gc.enable()
    clock = Clock()
    collector = ViewerCollector(clock)
    collector.start()
    clock.t += HOLD_MAX_S - 1
    assert not collector.attached(4096, settled=False) and not gc.isenabled()
    clock.t += 1
    assert collector.attached(4096, settled=False) and gc.isenabled() and collector.frozen
    collector.stop()
    assert gc.get_freeze_count() == 0


def test_stopped_while_held_the_collector_runs_again(restored: None) -> None:
    gc.enable()
    collector = ViewerCollector(Clock())
    collector.start()
    collector.stop()
    assert gc.isenabled() and not collector.held


def test_a_collector_disabled_before_stays_disabled(restored: None) -> None:
    gc.disable()
    collector = ViewerCollector(Clock())
    collector.start()
    assert not collector.held  # nothing to hold
    assert collector.attached(4096, settled=True) is False
    collector.stop()
    assert not gc.isenabled()


def test_the_old_policy_holds_nothing(restored: None) -> None:
    gc.enable()
    collector = ViewerCollector(Clock(), hold=False, freeze=False)
    collector.start()
    assert gc.isenabled() and not collector.held and gc.get_threshold()[0] == GC_THRESHOLD_0
    collector.stop()


def test_a_pause_holds_collections_off_until_resumed_and_nests_with_the_attach(restored: None) -> None:
    gc.enable()
    collector = ViewerCollector(Clock())
    collector.start()
    resume_a = collector.pause()  # during the attach: both keep it off
    assert collector.attached(FREEZE_FROM_RANKS - 1, settled=True)
    assert not gc.isenabled() and collector.paused  # released from the attach, still paused
    resume_b = collector.pause()
    resume_a()
    resume_a()  # once counts
    assert not gc.isenabled() and collector.paused
    resume_b()
    assert gc.isenabled() and not collector.paused
    collector.stop()


def test_a_pause_resumed_after_stop_changes_nothing(restored: None) -> None:
    gc.enable()
    collector = ViewerCollector(Clock())
    collector.start()
    collector.attached(FREEZE_FROM_RANKS - 1, settled=True)
    resume = collector.pause()
    assert not gc.isenabled()
    collector.stop()  # the viewer went while its diagnosis ran
    assert gc.isenabled() and not collector.paused
    gc.disable()  # whatever the process does next is its own
    resume()  # the diagnosis's thread ends late
    assert not gc.isenabled() and not collector.paused


def test_without_the_hold_a_pause_is_no_pause(restored: None) -> None:
    gc.enable()
    collector = ViewerCollector(Clock(), hold=False, freeze=False)
    collector.start()
    resume = collector.pause()
    assert gc.isenabled() and not collector.paused
    resume()
    collector.stop()
