"""A big job's diagnosis off the UI thread: the model copied a slice at a time between the UI's
other messages, then diagnosed on a worker thread that gives way to the UI's busy moments.

A base of :class:`~ddptop.tui.app.DdptopApp` (beside :mod:`ddptop.tui.table_actions`), which
starts a diagnosis from its redraw when :class:`~ddptop.tui.findings.FindingsPace` says one
is due. The copy (:class:`~ddptop.model.sliced_copy.SlicedCopy`) is taken on the UI thread,
where events are applied, one slice per message of its own, each through a turn of the event
loop: a key pressed meanwhile is handled between two slices (taken whole, the copy held the UI
50-110 ms at 32,768 ranks). The worker's long passes wait while the UI is busy, and for a
moment after a person's key (:mod:`ddptop.model.pace`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual.app import App

from ddptop.client.collector import ViewerCollector
from ddptop.diagnosis.finding import Finding
from ddptop.model.job import JobModel
from ddptop.model.pace import giving_way
from ddptop.model.sliced_copy import SLICE_RANKS, SlicedCopy
from ddptop.source import JobSource
from ddptop.tui.findings import Cadence, FindingsPace, findings, worst
from ddptop.tui.key_first import KeyFirst
from ddptop.tui.story_marks import story_marks
from ddptop.tui.widgets.findings_panel import FindingsPanel
from ddptop.tui.widgets.header import JobHeader
from ddptop.tui.widgets.rank_table import RankTable

# After a person's key the diagnosis waits this long before it goes on: the next key of a run
# then finds the UI free of it. It blocks only at its next chance to (every ~2-25 ms of work,
# ddptop.model.pace), and until then shares the interpreter: at 32,768 ranks on a busy node a
# move key of 5 ms of UI work took 15-30 ms during a diagnosis, 5-15 ms of it the diagnosis's.
KEY_LINGER_S = 0.25
# ...at most this long at a time, then as long freely (ddptop.source.GiveWay): keys pressed
# without end halve the diagnosis's pace at worst. Longer than a run of keys (forty keys back
# to back, an arrow key held down: about 1.5 s at 32,768 ranks), so that one run meets no free
# pass; and longer than the source's bound: findings come every 6-8 s at that size anyway,
# the events of 32,768 ranks cannot wait.
DIAGNOSIS_MAX_WAIT_S = 2.0


class BackgroundFindings(App[int]):
    """The background diagnosis of :class:`~ddptop.tui.app.DdptopApp` (see the module doc)."""

    source: JobSource  # set by the app
    model: JobModel  # set by the app: the job as shown
    findings: list[Finding]  # set by the app: what the panel shows
    paused: bool
    replay = False
    _pace: FindingsPace
    _cadence: Cadence
    # Set while a diagnosis is under way, from its copy's first slice to its findings shown.
    _diagnosing = False
    _copying: SlicedCopy | None = None
    copy_slice_ranks = SLICE_RANKS  # views copied per message
    diagnosis_waited_s = 0.0  # how long background diagnoses waited for the busy UI
    key_first: KeyFirst  # set by TableActions: upkeep waits while a key is on its way
    collector: ViewerCollector  # set by the app: the process's garbage collector policy
    _collection_resume: Callable[[], None] = staticmethod(lambda: None)  # the copy's pause

    def now(self) -> float:
        """The time the dashboard shows (the app's clock, or the replay's position)."""
        raise NotImplementedError

    def _diagnose_in_background(self) -> None:
        """Begin a diagnosis of the model as it is when its copy is done."""
        self._diagnosing = True
        # No automatic collection while the copy lives: freed by reference counting when the
        # diagnosis returns, it is never walked (ddptop.client.collector says what that saved).
        self._collection_resume = self.collector.pause()
        self._copying = SlicedCopy(self.model, self.copy_slice_ranks)
        self._copy_step()

    def _copy_step(self) -> None:
        copier = self._copying
        if copier is None:
            return
        if copier.model is not self.model or not self.is_running:  # another model shown, or shut down
            copier.cancel()
            self._copying, self._diagnosing = None, False
            self._collection_resume()
            return
        if self.key_first.waits("copy"):  # a key on its way goes first (ddptop.tui.key_first)
            return
        job = copier.step()
        if job is None:
            # Through a turn of the event loop, then behind what the app has queued by then: a
            # key waiting there, or already sent on to the focused widget's queue, goes first.
            asyncio.get_running_loop().call_soon(self.call_later, self._copy_step)
            return
        self._copying = None
        self._diagnose(job, self.now())

    def _diagnose(self, job: JobModel, now: float) -> None:
        # The worker gets its own JobModel of the moment: the current state objects (never
        # mutated, only replaced), exits and stuck reports, and each rank's history deque
        # itself, not a copy; the diagnosis reads a deque only through C-level calls (bisect,
        # list) that hold the GIL throughout, so appends by the UI thread cannot interleave
        # with them (see recent_samples).
        # Popped by the worker: Textual's Worker and this closure sit in a reference cycle, and
        # a copy held by the closure (32,768 views, merged states) waited for the collector.
        held = [job]
        del job
        # Its long passes wait while the UI is busy (a key, a redraw): sharing the GIL with
        # the diagnosis took keys twice as long (ddptop.model.pace).
        waiter = self.source.foreground.waiter(KEY_LINGER_S, DIAGNOSIS_MAX_WAIT_S)
        resume_collection = self._collection_resume

        def work() -> None:
            began = time.monotonic()
            try:
                with giving_way(waiter):
                    found = findings(held.pop(), now, self._cadence)
            finally:
                # Wall time, its waits included (a first version without them: key p95 80
                # against 42 ms at 32k): the pace keeps it to a share of the time.
                self.diagnosis_waited_s += waiter.gave_way_s
                self._pace.took(time.monotonic() - began)
                resume_collection()  # the copy is freed by now (popped, and its frame gone)
                self._diagnosing = False
            self.call_from_thread(self._show_findings, found)

        self.run_worker(work, thread=True, group="findings", exit_on_error=False)

    def _show_findings(self, found: list[Finding]) -> None:
        self.findings = found
        if not self.query(FindingsPanel):  # the worker finished while the app shut down
            return
        self.query_one(FindingsPanel).show(found)
        self.query_one(RankTable).set_story(*story_marks(found))
        self.query_one(JobHeader).show(self.model, self.now(), worst(found),
                                       "replay" if self.replay else "live", self.paused)
