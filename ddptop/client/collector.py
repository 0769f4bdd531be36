"""A viewer process's cyclic garbage collector: held off while a job attaches, then kept off
the states the viewer keeps.

Nothing a viewer keeps forms reference cycles (states, samples and pulses are freed by
reference counting when replaced), yet every container it allocates counts towards a
collection, and a full collection walks every tracked object: at 32,768 ranks, millions.
Measured with ``bench/tui_scale.py`` (32,768 synthetic ranks through their agents' digest
lane): collections took about 1.0 s of the 3.7 s of CPU the attach cost, six full ones while
55 MB of first states were decoded. Three measures, for a viewer (the dashboard, a bench),
never inside a rank:

* young collections every :data:`GC_THRESHOLD_0` allocations instead of CPython's 700:
  thousands of ranks replace thousands of small containers a second, which promoted them and
  triggered full collections (100-200 ms pauses at 4,096 ranks);
* no collection while the job attaches, until every rank is in or :data:`HOLD_MAX_S` passed;
* then, for a job of :data:`FREEZE_FROM_RANKS` ranks or more, one full collection and
  ``gc.freeze()``: what the attach kept (each rank's detail and history) moves to the permanent
  generation, which later collections skip. Undone when the viewer stops (a test process
  starts many viewers, whose frozen cycles would otherwise never be freed);
* no collection while a big job's background diagnosis holds its copy of the model
  (:meth:`ViewerCollector.pause`). The copy (32,768 views and their dicts) is freed by reference
  counting when the diagnosis returns, yet while it lived every young collection walked it with
  the unmerged pulses' lists: at 32,768 ranks all ten collections of a 20 s window came during a
  diagnosis, 771 ms in all, up to 184 ms each, each a pause for whichever thread allocated (the
  UI's keys waited); the count the copy added is taken back when it is freed, so none follows.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

GC_THRESHOLD_0 = 50_000  # allocations between young collections (CPython's default: 700)
HOLD_MAX_S = 30.0  # the longest an attach keeps the collector off (a rank that never answers)
FREEZE_FROM_RANKS = 1024  # below this a full collection costs a few ms: nothing to freeze


class ViewerCollector:
    """The policy of the module doc; :meth:`start` and :meth:`stop` bracket a viewer's life,
    :meth:`attached` is called now and then (each redraw) until it releases.

    *hold* and *freeze* off give the policy before the hold existed (a bench's A/B): no pause either."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, hold: bool = True,
                 freeze: bool = True, hold_max_s: float = HOLD_MAX_S) -> None:
        self._clock = clock
        self._hold, self._freeze, self._hold_max_s = hold, freeze, hold_max_s
        self._thresholds: tuple[int, ...] | None = None
        self._was_enabled = True
        self._held_since: float | None = None
        self.frozen = False
        self.release_s = 0.0  # what the one full collection at the release cost
        self._pauses = 0  # pauses not resumed yet (a diagnosis's copy lives)
        self._lock = threading.Lock()  # a pause is resumed from the diagnosis's thread
        self._life = 0  # stop() counts: a pause from before it is not resumed after it

    @property
    def held(self) -> bool:
        """True while the collector is held off for an attach."""
        return self._held_since is not None

    def start(self) -> None:
        """Young collections less often; none at all until :meth:`attached` releases."""
        self._thresholds = gc.get_threshold()
        gc.set_threshold(GC_THRESHOLD_0, *self._thresholds[1:])
        self._was_enabled = gc.isenabled()
        if self._hold and self._was_enabled:
            gc.disable()
            self._held_since = self._clock()

    def attached(self, ranks: int, settled: bool) -> bool:
        """The job has *ranks* ranks in the model, *settled* when every one has a state: release
        the hold once settled (or after HOLD_MAX_S), freezing what a big job's attach kept.
        True when this call released it."""
        if self._held_since is None or (not settled and self._clock() - self._held_since < self._hold_max_s):
            return False
        self._held_since = None
        if self._freeze and ranks >= FREEZE_FROM_RANKS:
            began = time.perf_counter()
            gc.collect()
            gc.freeze()
            self.frozen = True
            self.release_s = time.perf_counter() - began
        self._set_enabled()
        return True

    def pause(self) -> Callable[[], None]:
        """No automatic collection until the returned resume is called (from any thread; once
        counts, later calls do nothing): what is allocated meanwhile and freed by reference
        counting before the resume is never walked. Pauses nest; the attach's hold goes on."""
        if not self._hold:
            return lambda: None
        with self._lock:
            self._pauses += 1
            self._set_enabled()
            life = self._life
        resumed = False

        def resume() -> None:
            nonlocal resumed
            with self._lock:
                if not resumed and life == self._life:  # not after stop(): that undid every pause
                    resumed = True
                    self._pauses -= 1
                    self._set_enabled()
        return resume

    @property
    def paused(self) -> bool:
        """True while a pause is not resumed."""
        return self._pauses > 0

    def _set_enabled(self) -> None:
        # Automatic collections run iff they did before start(), no attach holds them off and
        # no pause is on.
        if self._was_enabled and self._held_since is None and not self._pauses:
            gc.enable()
        else:
            gc.disable()

    def stop(self) -> None:
        """Everything as it was before :meth:`start` (frozen objects back to the collector)."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
        if (self._held_since is not None or self._pauses) and self._was_enabled:
            gc.enable()
        self._held_since = None
        with self._lock:
            self._pauses = 0
            self._life += 1
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
