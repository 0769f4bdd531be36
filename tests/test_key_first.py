"""KeyFirst: the UI's upkeep waits while a person's key is on its way, at most a bound at a time."""

from __future__ import annotations

from ddptop.tui.key_first import UPKEEP_WAIT_MAX_S, KeyFirst


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_upkeep_runs_when_no_key_is_on_its_way() -> None:
    first = KeyFirst(Clock())
    assert not first.waits("fold") and not first.waits("redraw")
    assert first.shown() == [] and first.put_off == 0


def test_upkeep_waits_for_a_key_and_is_owed_once_when_it_is_shown() -> None:
    clock = Clock()
    first = KeyFirst(clock)
    first.arrived()
    assert first.waits("absorb")
    clock.t += 0.01
    assert first.waits("fold") and first.waits("absorb")  # asked twice, owed once
    assert first.put_off == 3
    assert first.shown() == ["absorb", "fold"]  # in the order they were first put off
    assert not first.waits("fold")  # no key on its way now
    first.arrived()
    assert first.shown() == []  # nothing waited for that one


def test_owed_upkeep_waits_until_the_last_key_on_its_way_is_shown() -> None:
    first = KeyFirst(Clock())
    first.arrived()
    first.arrived()
    assert first.waits("redraw")
    assert first.shown() == []  # one key still on its way
    assert first.waits("redraw")
    assert first.shown() == ["redraw"]
    assert first.shown() == [] and first.in_flight == 0  # a release too many counts nothing


def test_a_kind_waits_at_most_the_bound_at_a_time_then_runs_and_may_wait_afresh() -> None:
    clock = Clock()
    first = KeyFirst(clock)
    first.arrived()  # keys without a pause: one is always on its way
    assert first.waits("fold")
    clock.t += UPKEEP_WAIT_MAX_S - 0.001
    assert first.waits("fold") and first.waits("copy")
    clock.t += 0.001
    assert not first.waits("fold")  # waited the bound: it runs now, with a key on its way
    assert first.waits("copy")  # another kind keeps its own wait
    assert first.waits("fold")  # and the next fold may wait afresh
    clock.t += UPKEEP_WAIT_MAX_S
    assert not first.waits("copy") and not first.waits("fold")
    assert first.shown() == []  # what ran is not owed
