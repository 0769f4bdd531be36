"""A job model fed on a live source's thread and read on another.

``LiveSource`` calls its sink on its own selector thread, while a verb's main thread reads
the model to decide when it has seen enough. Every verb that watches a live job without
the dashboard (``doctor``, ``export``, ``record``, ``demo --no-tui``) folds through this one
class, so the lock and the per-rank bookkeeping ("has rank r sent N states, its history,
is it gone?") exist once. ``JobModel.apply`` stays the only fold from events to the model:
the dashboard calls it on its UI thread (events reach it through ``EventBuffer``), the
node agent under its own lock beside its exit watcher.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from ddptop.digest import PulseBatch
from ddptop.model.job import JobModel
from ddptop.protocol import ConnectionEvent, Event, HistoryMsg, RankExit, RecordEntry, StateMsg
from ddptop.status import FINAL, Status


class ModelFeed:
    """A ``JobModel`` plus what a watcher needs to know about each rank, behind one lock.

    Pass :meth:`emit` to ``LiveSource.start``. *tee* sees every event first, outside the
    lock (``record`` writes the stream to disk there: a slow disk must not hold up the
    readers of the model); *keep_events* keeps the events in arrival order (``export``
    writes them into the bundle).
    """

    def __init__(self, job_id: str = "", world_size: int = 0, *, keep_events: bool = False,
                 tee: Callable[[Event], None] | None = None) -> None:
        self.lock = threading.Lock()
        self.model = JobModel(job_id=job_id, world_size=world_size)
        self.events: list[Event] = []
        self._keep_events = keep_events
        self._tee = tee
        self.states: Counter[int] = Counter()  # states received per rank
        self.histories: set[int] = set()  # ranks whose history arrived
        self.gone: set[int] = set()  # ranks that sent a final state or were lost

    def emit(self, event: Event) -> None:
        """Fold one event (called on the source's thread)."""
        if self._tee is not None:
            self._tee(event)
        with self.lock:
            if self._keep_events:
                self.events.append(event)
            self.model.apply(event)
            if isinstance(event, RecordEntry):
                message = event.message
                if isinstance(message, StateMsg):
                    self.states[event.rank] += 1
                    if message.state.status in FINAL:
                        self.gone.add(event.rank)
                elif isinstance(message, HistoryMsg):
                    self.histories.add(event.rank)
            elif isinstance(event, RankExit) or (isinstance(event, ConnectionEvent)
                                                 and event.status in (Status.LOST, Status.UNREACHABLE)):
                self.gone.add(event.rank)

    def pulses(self, batch: PulseBatch) -> None:
        """Fold a digest's pulses (called on the source's thread): each is its rank's newest
        state, and the samples it carries were states too. A consumer that keeps or tees events
        gets them as whole states (and the samples before each as its history)."""
        if self._tee is not None or self._keep_events:
            for entry in batch.entries():
                self.emit(entry)
            return
        with self.lock:
            self.model.apply(batch)
            self.states.update(p.rank for p in batch.pulses)
            for p in batch.pulses:  # the samples a wide job's pulse carried: states sent too
                if p.earlier:
                    self.states[p.rank] += len(p.earlier)

    def settled(self, ranks: Iterable[int], states: int = 1, history: bool = False) -> int:
        """How many of *ranks* sent at least *states* states (and their history, if
        *history*), or are gone: once all are, watching longer adds nothing."""
        with self.lock:
            return sum(1 for r in ranks if r in self.gone
                       or (self.states[r] >= states and (not history or r in self.histories)))

    def wait_settled(self, ranks: Iterable[int], timeout_s: float, *, states: int = 1, history: bool = False,
                     progress: Callable[[int], None] | None = None, tick_s: float = 0.05) -> int:
        """Wait (at most *timeout_s*) until every one of *ranks* is :meth:`settled`; return how
        many are. *progress* hears the count whenever it changes. Polled, not notified: a
        check is a pass over every rank, too dear to run on each of thousands of events."""
        wanted = list(ranks)
        # A check holds the lock and the GIL for a pass over every rank (~8 ms at 32,768):
        # checked every 50 ms it took a third of the source thread's time while it attached.
        tick_s = max(tick_s, len(wanted) / 65536)
        deadline = time.monotonic() + timeout_s
        done = -1
        while True:
            now_done = self.settled(wanted, states=states, history=history)
            if progress is not None and now_done != done:
                progress(now_done)
            done = now_done
            left = deadline - time.monotonic()
            if done >= len(wanted) or left <= 0:
                return done
            time.sleep(min(tick_s, left))

    def heard_from_any(self) -> bool:
        """True once any rank sent a state."""
        with self.lock:
            return bool(self.states)

    def statuses(self, now: float) -> dict[int, str]:
        """Every rank's status word at *now* (see ``JobModel.statuses``)."""
        with self.lock:
            return self.model.statuses(now)

    def copy(self) -> JobModel:
        """A copy of the model, safe to read while events keep arriving."""
        with self.lock:
            return self.model.copy()
