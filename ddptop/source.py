"""What a data source is: the one thing the dashboard, doctor and recorder depend on.

A source emits events (``RecordEntry`` wrapping a rank's message, and
``ConnectionEvent``) through a callback, from its own thread. The live source talks to
ranks over TCP; the replay source reads a recording. The app gets a source injected
through its constructor and never knows which one it has (memray's live/replay split).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from ddptop.digest import PulseBatch
from ddptop.model.job import JobModel
from ddptop.protocol import Event, FrTraceMsg, RankState, StacksMsg

Emit = Callable[[Event], None]
# Where the node agents' digest lane goes (ddptop.digest.PulseBatch, one per node digest): a
# consumer that folds into a JobModel takes the batches as they are, in order with its events.
PulseSink = Callable[[PulseBatch], None]


# The longest a source's thread waits for a busy UI at a time, and then reads on freely as long:
# a UI that stays busy cannot starve it (the kernel's socket buffers hold what arrives).
GIVE_WAY_MAX_S = 0.25


class GiveWay:
    """One thread's way of giving way to a busy UI: its own free pass and its own count (the
    live source's thread and the background diagnosis each hold one). With *linger_s* it also
    waits until that long after a person's last key (:meth:`Foreground.hold` with ``key``)."""

    def __init__(self, free: threading.Event, max_wait_s: float, linger_s: float = 0.0,
                 last_key: Callable[[], float] = lambda: -math.inf) -> None:
        self._free = free
        self._max_wait_s = max_wait_s
        self._linger_s = linger_s
        self._last_key = last_key
        self._pass_until = 0.0  # after a wait the UI outlasted: go on freely until then
        self.waiting = False  # this thread is giving way now
        self.gave_way_s = 0.0  # how long this thread waited in all (what a test reads)

    def __call__(self) -> None:
        """Wait while the UI is busy (or within *linger_s* of a key), at most *max_wait_s*."""
        now = time.monotonic()
        if now < self._pass_until or (self._free.is_set() and now >= self._last_key() + self._linger_s):
            return
        began, deadline = now, now + self._max_wait_s
        self.waiting = True
        while now < deadline:
            if not self._free.is_set():
                self._free.wait(deadline - now)
            else:
                quiet_at = self._last_key() + self._linger_s
                if now >= quiet_at:
                    break
                # A person pressing keys: the next one comes soon, let it find the UI free of
                # this thread (it blocks at its next chance only: between, it shares the GIL).
                time.sleep(min(quiet_at, deadline) - now)
            now = time.monotonic()
        else:
            # The UI stayed busy throughout: go on as long without waiting, so that a UI
            # busy without end halves this thread's pace at worst, never stops it.
            self._pass_until = now + self._max_wait_s
        self.waiting = False
        self.gave_way_s += now - began


class Foreground:
    """The moments a viewer's UI thread works for a person: other threads give way.

    Python runs one thread at a time. At 32,768 ranks a redraw (about 60 ms of work alone)
    took twice that while the source's thread decoded frames beside it, and a key waited for
    both. The UI marks its redraws and key actions with :meth:`busy` (and a key from its
    arrival to its repaint with :meth:`hold`); the source's thread
    calls :meth:`give_way` before each read, and another thread (the background diagnosis)
    gives way through a :meth:`waiter` of its own. Only the UI thread calls ``busy`` and
    ``hold`` (re-entrant).
    """

    def __init__(self, max_wait_s: float = GIVE_WAY_MAX_S) -> None:
        self._free = threading.Event()
        self._free.set()
        self._depth = 0
        self._max_wait_s = max_wait_s
        self._source = GiveWay(self._free, max_wait_s)
        self.key_released_at = -math.inf  # when a person's last key was shown (monotonic)

    @property
    def is_busy(self) -> bool:
        """Whether the UI marked itself busy (a source's thread would wait)."""
        return not self._free.is_set()

    @property
    def waiting(self) -> bool:
        """Whether the source's thread is giving way now."""
        return self._source.waiting

    @property
    def gave_way_s(self) -> float:
        """How long the source's thread waited in all."""
        return self._source.gave_way_s

    @contextmanager
    def busy(self) -> Iterator[None]:
        """The UI is busy for the duration: the threads that give way wait."""
        release = self.hold()
        try:
            yield
        finally:
            release()

    def hold(self, key: bool = False, then: Callable[[], None] | None = None) -> Callable[[], None]:
        """The UI is busy from now until the returned release is called (once counts; later
        calls do nothing): a key from its arrival until the screen shows what it did, through
        Textual's steps between its handlers, which :meth:`busy` blocks do not cover. A *key*'s
        release is the moment a waiter with a linger counts from; *then* runs after the release."""
        self._depth += 1
        self._free.clear()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                if key:
                    self.key_released_at = time.monotonic()
                self._depth -= 1
                if not self._depth:
                    self._free.set()
                if then is not None:
                    then()
        return release

    def give_way(self) -> None:
        """Called by a source's thread: wait while the UI is busy, at most *max_wait_s*."""
        self._source()

    def waiter(self, linger_s: float = 0.0, max_wait_s: float | None = None) -> GiveWay:
        """A give-way of its own for another thread (its pass and count apart from the source's);
        with *linger_s*, it also waits until that long after a person's last key."""
        return GiveWay(self._free, self._max_wait_s if max_wait_s is None else max_wait_s, linger_s,
                       lambda: self.key_released_at)


class StacksResult:
    """Stacks gathered from ranks, and the ranks that could not give theirs (with why)."""

    def __init__(self, stacks: dict[int, StacksMsg], errors: dict[int, str]) -> None:
        self.stacks = stacks
        self.errors = errors


class StatesResult:
    """Fresh whole states of ranks (every field, the on-demand ones included), when each was
    taken on the viewer's clock, and the ranks that could not give theirs (with why)."""

    def __init__(self, states: dict[int, RankState], taken_at: dict[int, float],
                 errors: dict[int, str]) -> None:
        self.states = states
        self.taken_at = taken_at
        self.errors = errors


class JobSource(Protocol):
    """A stream of job events plus on-demand requests."""

    live: bool
    description: str
    foreground: Foreground  # the UI's busy moments, which the source's thread gives way to

    def start(self, emit: Emit, pulses: PulseSink | None = None) -> None:
        """Begin emitting events from a background thread; returns at once. Pulses of the
        digest lane go to *pulses*, or through *emit* as whole states when it is None."""

    def stop(self) -> None:
        """Stop emitting and release every resource (idempotent)."""

    def request_stacks(self, ranks: Sequence[int] | None = None, timeout: float = 5.0) -> StacksResult:
        """Blocking: every selected rank's stacks (call from a worker, not the UI thread)."""
        ...

    def request_fr_traces(self, ranks: Sequence[int] | None = None,
                          timeout: float = 5.0) -> dict[int, FrTraceMsg]:
        """Blocking: Flight Recorder dumps of the selected ranks."""
        ...

    def request_states(self, ranks: Sequence[int], timeout: float = 5.0) -> StatesResult:
        """Blocking: fresh whole states of *ranks* (the rank detail screen's on-demand fields)."""
        ...

    def on_demand_stale(self, rank: int) -> bool:
        """Whether *rank*'s on-demand fields (:data:`ddptop.digest.ON_DEMAND_FIELDS`) are only
        as fresh as its last detail (a node agent's digest lane), so that a person looking at
        it should ask :meth:`request_states`; False where every state carries them."""
        ...


@runtime_checkable
class ReplayableSource(JobSource, Protocol):
    """A source over a finished recording: the app asks for the job at any moment.

    The dashboard in replay mode does not fold events; it asks ``model_at(t)`` whenever
    the timeline moves, so every panel shows the state at the chosen moment.
    """

    start_time: float
    end_time: float

    def model_at(self, t: float) -> JobModel:
        """The job as it was known at wall-clock time *t* (events with time <= t)."""
        ...

    def event_times(self) -> list[float]:
        """Times at which anything was recorded, ascending (for stepping)."""
        ...

    def first_finding_time(self) -> float | None:
        """Earliest moment the diagnosis reports a warning or worse (None if never)."""
        ...
