"""A thread-safe hand-off of source events to the UI thread, with coalesced wake-ups.

The source thread calls :meth:`EventBuffer.push` for every event; only the push that
finds the buffer empty asks for a wake-up, so the UI gets one message per batch however
fast events arrive (and the message's ``can_replace`` folds any that still pile up).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ddptop.digest import PulseBatch
from ddptop.protocol import Event

MAX_PENDING = 200_000  # beyond this (UI stalled for long), drop the oldest: state is refreshed anyway


class EventBuffer:
    """Events waiting for the UI thread."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._events: list[Event | PulseBatch] = []
        self._wake = wake
        self.dropped = 0

    def push(self, event: Event | PulseBatch) -> None:
        """Called from the source thread: keep the event, wake the UI if it was idle."""
        with self._lock:
            was_empty = not self._events
            self._events.append(event)
            if len(self._events) > MAX_PENDING:
                del self._events[: len(self._events) - MAX_PENDING]
                self.dropped += 1
        if was_empty:
            self._wake()

    def put_back(self, events: list[Event | PulseBatch]) -> None:
        """Called on the UI thread: *events*, taken by :meth:`drain` and not folded yet, go back
        before any that arrived since (the caller asks for the next wake-up itself)."""
        with self._lock:
            self._events[:0] = events

    def drain(self) -> list[Event | PulseBatch]:
        """Called on the UI thread: take every waiting event, oldest first."""
        with self._lock:
            events, self._events = self._events, []
        return events
