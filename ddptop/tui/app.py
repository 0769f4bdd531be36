"""``DdptopApp``: wires a :class:`~ddptop.source.JobSource` to the dashboard widgets.

Live mode: the source emits events on its own thread into an :class:`EventBuffer`; the
first event of a batch posts :class:`EventsReady` (``can_replace``, so wake-ups never
queue up); the UI thread folds the batch into a :class:`JobModel` and a timer redraws at
most every ``redraw_interval`` seconds (every half second from 16,384 ranks on), and only
when something changed (or once a second, so "stale" and uptimes move on a quiet job).

Replay mode (the source has ``model_at``): nothing is folded; the timeline's position
picks ``source.model_at(t)`` and every panel shows that moment, with *t* as "now".
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Footer

from ddptop.client.collector import ViewerCollector
from ddptop.diagnosis.finding import Finding
from ddptop.model.job import JobModel
from ddptop.source import JobSource, ReplayableSource
from ddptop.tui import export as exporting
from ddptop.tui.background_findings import BackgroundFindings
from ddptop.tui.event_buffer import EventBuffer
from ddptop.tui.findings import Cadence, FindingsPace, findings, worst
from ddptop.tui.replay_actions import ReplayActions
from ddptop.tui.row_index import GROUP_FROM_RANKS, RowIndex
from ddptop.tui.rows import RowBuilder
from ddptop.tui.screens.help import HelpScreen
from ddptop.tui.story_marks import story_marks
from ddptop.tui.table_actions import TableActions
from ddptop.tui.widgets.findings_panel import FindingsPanel
from ddptop.tui.widgets.header import JobHeader
from ddptop.tui.widgets.rank_table import RankTable
from ddptop.tui.widgets.timeline import Timeline

log = logging.getLogger(__name__)

QUIET_REDRAW_S = 1.0  # redraw at least this often: statuses turn "stale" with time alone
# From this many ranks on, a changed job is redrawn every SLOW_REDRAW_S, not every redraw
# interval: a redraw of 32,768 ranks costs 15-30 ms of the one core a busy node leaves the
# viewer, and each rank's values change once a second (its sample interval) all the same.
SLOW_REDRAW_FROM_RANKS = 16_384
SLOW_REDRAW_S = 0.5
# From this many ranks on, the diagnosis runs on a worker thread so keys stay responsive;
# below it, it costs a few ms and runs inline (deterministic for tests and replay).
BACKGROUND_FINDINGS_RANKS = 256
# While the app runs, a thread that wants the interpreter gets it within 1 ms, not CPython's
# 5: the UI thread waits for it at every await of a key's way through Textual while the
# diagnosis works (sort keys met by one, 32,768 ranks: median 29 against 67 ms, with pace).
UI_SWITCH_INTERVAL_S = 0.001
# The UI folds waiting events in slices of about this long, each a message of its own: a key
# pressed meanwhile is handled after the slice, not after the whole backlog (at 32,768 ranks a
# quarter of a second of pulses is tens of ms to fold and absorb).
FOLD_SLICE_S = 0.008
_MAIN_ONLY = {"stacks", "export", "filter", "sort", "toggle_order", "pause", "refresh", "cycle_view"}
_REPLAY_ONLY = {"step", "edge", "first_finding", "play", "speed"}


class EventsReady(Message):
    """Source events are waiting in the buffer (one pending message is enough)."""

    def can_replace(self, message: Message) -> bool:
        """Any older EventsReady still queued says the same thing."""
        return isinstance(message, EventsReady)


class AbsorbReady(Message):
    """Ranks folded by a slice wait for the row index's absorb (one pending message is enough)."""

    def can_replace(self, message: Message) -> bool:  # any older one queued says the same
        return isinstance(message, AbsorbReady)


class DdptopApp(TableActions, ReplayActions, BackgroundFindings):
    """The dashboard. ``source`` is live or replayable; ``clock`` gives "now" in live mode."""

    CSS_PATH = "ddptop.tcss"
    TITLE = "ddptop"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("s", "stacks", "stacks"),
        Binding("e", "export", "export"),
        Binding("slash", "filter", "filter"),
        Binding("less_than_sign", "sort(-1)", "sort ←", key_display="<"),
        Binding("greater_than_sign", "sort(1)", "sort →", key_display=">"),
        Binding("o", "toggle_order", "order", show=False),
        Binding("g", "cycle_view", "view", show=False),  # ranks | odd | node | status | collective
        Binding("p", "pause", "pause"),
        Binding("r", "refresh", "refresh"),
        Binding("left", "step(-1)", "back", priority=True),
        Binding("right", "step(1)", "fwd", priority=True),
        Binding("home", "edge(0)", "start", show=False, priority=True),
        Binding("end", "edge(1)", "end", show=False, priority=True),
        Binding("f", "first_finding", "1st finding"),
        Binding("space", "play", "play", priority=True),
        Binding("plus,equals_sign", "speed(1)", "faster", show=False),
        Binding("minus", "speed(-1)", "slower", show=False),
    ]

    def __init__(self, source: JobSource, clock: Callable[[], float] = time.time, *,
                 redraw_interval: float = 0.25, export_dir: Path | None = None) -> None:
        super().__init__()
        self.source = source
        self.clock = clock
        self.redraw_interval = redraw_interval
        self.export_dir = export_dir
        # The source is typed by what it can do (memray's live/replay split): a replayable
        # one answers model_at(t) and the app drives a timeline over it.
        self.recording: ReplayableSource | None = source if isinstance(source, ReplayableSource) else None
        self.replay = self.recording is not None
        self.model = JobModel()
        self.findings: list[Finding] = []
        self.paused = False
        self.redraws = 0
        self._dirty = True
        self._last_redraw = 0.0
        self._pace = FindingsPace()  # when the next diagnosis is due
        self._buffer = EventBuffer(self._wake)
        self._started = False
        self._cadence = Cadence()  # a big job's rate rules every 10 s
        self._switch_before = sys.getswitchinterval()  # the interpreter's, restored at unmount
        self._rows = RowBuilder()  # rows of unchanged ranks are reused between redraws
        self._index: RowIndex | None = None  # above GROUP_FROM_RANKS: visible rows and groups
        self.collector = ViewerCollector()  # held off while the job attaches (its module says why)

    # ------------------------------------------------------------ wiring

    def compose(self) -> ComposeResult:
        """Header, rank table, findings, (timeline), footer."""
        yield JobHeader(id="header")
        yield RankTable(id="ranks")
        yield FindingsPanel(id="findings")
        if self.recording is not None:
            src = self.recording
            yield Timeline(src.start_time, src.end_time, list(src.event_times()), id="timeline")
        yield Footer()

    def on_mount(self) -> None:
        """Start the source (live) or show the end of the recording (replay)."""
        self.sub_title = self.source.description
        self.query_one(RankTable).focus()
        self.collector.start()
        self._switch_before = sys.getswitchinterval()
        sys.setswitchinterval(UI_SWITCH_INTERVAL_S)
        if self.replay:
            self._load_moment(self.query_one(Timeline).t)
        else:
            try:
                self.source.start(self._buffer.push, pulses=self._buffer.push)
                self._started = True
            except Exception as exc:  # e.g. nothing reachable: say so, keep the UI up
                log.warning("source failed to start: %s", exc)
                self.notify(f"cannot attach: {exc}", severity="error", timeout=30)
        self.set_interval(self.redraw_interval, self._tick)
        self.redraw()

    def on_unmount(self) -> None:
        """Stop the source (its thread, its sockets); the collector and the switch interval as they were."""
        self.collector.stop()
        sys.setswitchinterval(self._switch_before)
        try:
            self.source.stop()
        except Exception as exc:
            log.warning("source stop failed: %s", exc)

    def _wake(self) -> None:
        # Called on the source thread; post_message is thread-safe in Textual.
        self.post_message(EventsReady())

    def on_events_ready(self, _message: EventsReady) -> None:
        """Fold every waiting event into the model; the timer redraws."""
        if self.key_first.waits("fold"):  # the events stay in the buffer until the key is shown
            return
        events = self._buffer.drain()
        if self._buffer.dropped:  # the next redraw says so: what is shown lags the job
            for header in self.query(JobHeader):  # none while the app shuts down
                header.dropped = self._buffer.dropped
        with self.source.foreground.busy():
            began, apply = time.perf_counter(), self.model.apply
            for i, event in enumerate(events):
                apply(event)
                if i & 15 == 15 and time.perf_counter() - began > FOLD_SLICE_S and i + 1 < len(events):
                    # The rest after what came meanwhile (a key): put back first in line, and
                    # this message again behind the key.
                    self._buffer.put_back(events[i + 1:])
                    self.post_message(EventsReady())
                    break
        if events and self._model_index() is not None:
            # The per-rank part of the next redraw, as events come: a message of its own,
            # behind what came meanwhile, so that a key pressed during a slice waits for the
            # folding alone (the absorb after it costs about twice as much at 32,768 ranks).
            self.post_message(AbsorbReady())
        self._dirty = self._dirty or bool(events)

    def on_absorb_ready(self, _message: AbsorbReady) -> None:
        """The row index takes in the ranks folded since (the redraw takes in what is left)."""
        if (index := self._model_index()) is not None and not self.key_first.waits("absorb"):
            with self.source.foreground.busy():
                index.absorb()

    def resume_upkeep(self, kind: str) -> None:
        """Upkeep that waited for a person's keys (``ddptop.tui.key_first``) is asked for again."""
        if kind == "fold":
            self.post_message(EventsReady())
        elif kind == "absorb":
            self.post_message(AbsorbReady())
        elif kind == "redraw":
            self.call_later(self._tick)
        elif kind == "copy":
            self.call_later(self._copy_step)

    def now(self) -> float:
        """The moment shown: the clock (live) or the timeline position (replay)."""
        if self.replay:
            return self.query_one(Timeline).t
        return self.clock()

    def _tick(self) -> None:
        # While the app shuts down its widgets go before its timers, one by one: a tick then
        # finds the table gone (seen at 4,096 ranks), or the table still there but the findings
        # panel gone (seen at 32,768 ranks, bench/collector_ab.py).
        drawn: tuple[type[Widget], ...] = (RankTable, FindingsPanel, JobHeader)
        if self.paused or not self.is_running or not all(self.query(kind) for kind in drawn):
            return
        wall = time.monotonic()
        since = wall - self._last_redraw
        # Half a timer period of slack: the timer's ticks come one interval apart, and the
        # last redraw ended a little after its tick.
        if ((self._dirty and since >= self.redraw_period() - self.redraw_interval / 2)
                or since >= QUIET_REDRAW_S) and not self.key_first.waits("redraw"):
            self.redraw()

    def _job_size(self) -> int:  # ranks heard from, or announced by a world size: the more
        return max(len(self.model.ranks), self.model.world_size)

    def _model_index(self) -> RowIndex | None:  # the row index, if it follows the model shown
        return self._index if self._index is not None and self._index.model is self.model else None

    def quiet_toasts(self) -> bool:
        """From SLOW_REDRAW_FROM_RANKS ranks on, a sort key shows no toast: the column title's
        ▲/▼ says the same, and a toast laid over the screen took a tenth of a sort key's time
        at 32,768 ranks on a busy node (key p95 129 against 147 ms, three turns each)."""
        return self._job_size() >= SLOW_REDRAW_FROM_RANKS

    def redraw_period(self) -> float:
        """Seconds between two redraws of a changing job: the redraw interval, or
        :data:`SLOW_REDRAW_S` from :data:`SLOW_REDRAW_FROM_RANKS` ranks on."""
        return max(self.redraw_interval, SLOW_REDRAW_S) if self._job_size() >= SLOW_REDRAW_FROM_RANKS \
            else self.redraw_interval

    def redraw(self, fresh_findings: bool = False) -> None:
        """Rebuild rows and header from the model at :meth:`now`; findings at most once a second
        (always in replay and when *fresh_findings*). The source's thread waits meanwhile."""
        with self.source.foreground.busy():
            self._redraw(fresh_findings)

    def _redraw(self, fresh_findings: bool) -> None:
        now = self.now()
        wall = time.monotonic()
        table = self.query_one(RankTable)
        if self._job_size() > GROUP_FROM_RANKS or self._model_index() is not None:
            if self._index is None or self._index.model is not self.model:
                self._index = _index_like(self.model, self._index)
            table.set_sequence(self._index.refresh(now), self._index.every_row)
            statuses, counts = self._index.statuses, self._index.word_counts
        else:
            table.set_rows(self._rows.build(self.model, now))
            statuses, counts = self._rows.statuses, None
        # New ranks (first data, a rank appearing) deserve findings at once, a changed status
        # word soon (FindingsPace); the words are the index's counts, kept as ranks change.
        ranks = len(self.model.ranks)
        if fresh_findings or self.replay or self._pace.due(wall, ranks, counts):
            if self.replay or ranks < BACKGROUND_FINDINGS_RANKS:
                self.findings = findings(self.model, now)
                self._pace.began(wall, ranks, counts)
            elif not self._diagnosing:
                self._diagnose_in_background()
                self._pace.began(wall, ranks, counts)
        self.query_one(FindingsPanel).show(self.findings)
        table.set_story(*story_marks(self.findings))  # the culprits lead; each victim says whom it waits for
        self.query_one(JobHeader).show(self.model, now, worst(self.findings),
                                       "replay" if self.replay else "live", self.paused, statuses, counts)
        if self.collector.held:
            self.collector.attached(len(self.model.ranks), self.replay or self.model.settled())
        self._dirty = False
        self._last_redraw = time.monotonic()
        self.redraws += 1

    def _load_moment(self, t: float) -> None:
        if self.recording is None:
            return
        try:
            self.model = self.recording.model_at(t)
        except Exception as exc:
            self.notify(f"cannot load the moment {t:.1f}: {exc}", severity="error")
            return
        self.redraw()

    def on_timeline_moved(self, message: Timeline.Moved) -> None:
        """Replay: show the job at the new position."""
        self._load_moment(message.t)

    def on_rank_table_group_chosen(self, message: RankTable.GroupChosen) -> None:
        """Enter on a group row: expand or fold it in place."""
        if self._index is not None:
            self._index.toggle(message.key)
            self.redraw()

    def action_cycle_view(self) -> None:
        """Next table view: ranks | odd | node | status | collective (big jobs only)."""
        if self._index is None:
            self.notify(f"grouped views from {GROUP_FROM_RANKS + 1:,} ranks", severity="warning")
            return
        self.notify(f"view: {self._index.cycle()}")
        self.redraw()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Replay keys only in replay; dashboard keys only on the dashboard screen."""
        if action in _REPLAY_ONLY and not self.replay:
            return False
        if action in _MAIN_ONLY | _REPLAY_ONLY and len(self.screen_stack) > 1:
            return False
        return not (action == "pause" and self.replay)

    # ------------------------------------------------------------ actions

    def action_help(self) -> None:
        """Key help."""
        self.push_screen(HelpScreen())

    def action_export(self) -> None:
        """Export in a worker thread; report the file or the error."""
        self.notify("exporting…")
        # The worker gets a copy: the UI thread keeps folding events into self.model.
        model, now = self.model.copy(), self.now()
        self.run_worker(lambda: self._export(model, now), thread=True, exclusive=True, group="export")

    def _export(self, model: JobModel, now: float) -> None:
        try:
            _path, line = exporting.export(self.source, model, now, self.export_dir)
        except Exception as exc:
            log.warning("export failed: %s", exc)
            self.call_from_thread(self.notify, f"export failed: {exc}", severity="error", timeout=15)
            return
        self.call_from_thread(self.notify, line, timeout=15)

    def action_pause(self) -> None:
        """Freeze the display (events are still folded, so resuming is current)."""
        self.paused = not self.paused
        self.query_one(JobHeader).show(self.model, self.now(), worst(self.findings), "live", self.paused)
        self.notify("paused: press p to resume" if self.paused else "resumed", timeout=3)

    def action_refresh(self) -> None:
        """Redraw now (also while paused)."""
        self.redraw(fresh_findings=True)
        self.notify("refreshed", timeout=2)


def _index_like(model: JobModel, before: RowIndex | None) -> RowIndex:
    """A row index of *model* showing what *before* showed (a replay seek brings a new model)."""
    index = RowIndex(model)
    if before is not None:
        index.view, index.expanded = before.view, before.expanded
    return index
