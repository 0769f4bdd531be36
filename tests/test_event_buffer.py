"""The hand-off of source events to the UI thread (ddptop.tui.event_buffer.EventBuffer).

Only the push that finds the buffer empty wakes the UI: one message per batch however fast
events arrive. Real threads, bounded joins.
"""

from __future__ import annotations

import threading

from ddptop.protocol import ConnectionEvent
from ddptop.tui.event_buffer import MAX_PENDING, EventBuffer


def _event(rank: int) -> ConnectionEvent:
    return ConnectionEvent(time=float(rank), rank=rank, status="connected")


def test_one_wake_per_batch_oldest_first() -> None:
    wakes: list[int] = []
    buffer = EventBuffer(lambda: wakes.append(1))
    for r in range(5):
        buffer.push(_event(r))
    assert wakes == [1]  # the first push only: the UI has not taken any yet
    assert [e.rank for e in buffer.drain()] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]
    assert buffer.drain() == []
    buffer.push(_event(5))
    assert wakes == [1, 1]  # empty again: this push wakes the UI


def test_a_pushing_thread_loses_nothing() -> None:
    buffer = EventBuffer(lambda: None)
    n = 20_000

    def produce() -> None:
        for r in range(n):
            buffer.push(_event(r))

    producer = threading.Thread(target=produce)
    producer.start()
    taken: list[int] = []
    while producer.is_alive():
        taken += [e.rank for e in buffer.drain()]  # type: ignore[union-attr]
    producer.join(30.0)
    taken += [e.rank for e in buffer.drain()]  # type: ignore[union-attr]
    assert taken == list(range(n)) and buffer.dropped == 0


def test_a_stalled_ui_loses_the_oldest_events_and_counts_each() -> None:
    buffer = EventBuffer(lambda: None)
    for r in range(MAX_PENDING + 5):
        buffer.push(_event(r))
    kept = buffer.drain()
    assert buffer.dropped == 5 and len(kept) == MAX_PENDING
    assert kept[0].rank == 5 and kept[-1].rank == MAX_PENDING + 4  # type: ignore[union-attr]
