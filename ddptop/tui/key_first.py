"""A person's key goes before the dashboard's upkeep: while a key is on its way through the UI
(from its arrival to the repaint that shows it), the upkeep that would run on the UI thread
meanwhile waits, and is asked for again once the key is shown.

The upkeep is each kind of work the UI thread does for the data, not for a person: folding the
source's events into the model, absorbing the folded ranks into the row index, the timer's
redraw, and the slices of a background diagnosis's copy. Each runs as a message of its own on
the app's queue, which is first in, first out; and a key travels through three queues (the
app's, the focused widget's, the app's again when it bubbles back to the app's bindings), each
time behind what was posted meanwhile. At 32,768 ranks on a busy node a key then waited behind
up to four folds and three absorbs posted during its trip (60-150 ms), measured with a
timeline of every message handled between a key's arrival and its repaint.

Each kind waits at most :data:`UPKEEP_WAIT_MAX_S` at a time, then runs once even with a key on
its way (keys without a pause, an arrow key held down): what is shown is at most that much
later than without keys. Pure bookkeeping with the clock passed in; the app decides what each
kind is and how to ask for it again (``ddptop.tui.app``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The longest one kind of upkeep waits for keys at a time: the redraw period of a big job
# (SLOW_REDRAW_S), so a run of keys costs the data at most one redraw.
UPKEEP_WAIT_MAX_S = 0.5


class KeyFirst:
    """Which upkeep waits for the keys on their way now, and what is owed once they are shown."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 max_wait_s: float = UPKEEP_WAIT_MAX_S) -> None:
        self._clock = clock
        self._max_wait_s = max_wait_s
        self.in_flight = 0  # keys arrived and not shown yet
        self._waiting_since: dict[str, float] = {}  # kind -> when it was first put off
        self.put_off = 0  # how often upkeep waited, all kinds together (a bench reads it)

    def arrived(self) -> None:
        """A person's key reached the app."""
        self.in_flight += 1

    def shown(self) -> list[str]:
        """A key's repaint is done (or its hold timed out): once no key is on its way, the kinds
        of upkeep that waited, oldest first, to be asked for again (each once)."""
        self.in_flight = max(0, self.in_flight - 1)
        if self.in_flight:
            return []
        owed = sorted(self._waiting_since, key=self._waiting_since.__getitem__)
        self._waiting_since.clear()
        return owed

    def waits(self, kind: str) -> bool:
        """Whether upkeep of *kind*, about to run, waits instead (the caller then returns, and
        :meth:`shown` names it later). False when no key is on its way, or when *kind* has
        waited :data:`UPKEEP_WAIT_MAX_S` already: it runs now, and may wait afresh next time."""
        if not self.in_flight:
            return False
        now = self._clock()
        since = self._waiting_since.setdefault(kind, now)
        if now - since >= self._max_wait_s:
            del self._waiting_since[kind]
            return False
        self.put_off += 1
        return True
