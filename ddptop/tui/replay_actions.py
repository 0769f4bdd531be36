"""The dashboard's replay keys: step, jump, play and speed along a recording's timeline.

A base of :class:`~ddptop.tui.app.DdptopApp` (beside :mod:`ddptop.tui.table_actions`), so that
the app keeps to wiring and redrawing; the timeline widget itself does the moving
(:mod:`ddptop.tui.widgets.timeline`).
"""

from __future__ import annotations

from textual.app import App

from ddptop.source import ReplayableSource
from ddptop.tui.widgets.timeline import Timeline


class ReplayActions(App[int]):
    """The replay actions of :class:`~ddptop.tui.app.DdptopApp` (bound to keys there)."""

    recording: ReplayableSource | None = None  # set by the app: the source, when it replays

    def action_step(self, n: int) -> None:
        """Replay: previous/next recorded moment."""
        self.query_one(Timeline).step(n)

    def action_edge(self, end: int) -> None:
        """Replay: first or last moment."""
        timeline = self.query_one(Timeline)
        timeline.seek(timeline.end if end else timeline.start)

    def action_play(self) -> None:
        """Replay: play / pause."""
        playing = self.query_one(Timeline).toggle_play()
        self.notify("playing" if playing else "paused", timeout=2)

    def action_speed(self, delta: int) -> None:
        """Replay: faster / slower."""
        self.notify(f"speed {self.query_one(Timeline).change_speed(delta):g}x", timeout=2)

    def action_first_finding(self) -> None:
        """Replay: jump to the first moment with a warning or worse (the recording knows it)."""
        if self.recording is None:
            return
        first = self.recording.first_finding_time()
        if first is None:
            self.notify("no finding anywhere in this recording")
            return
        self.query_one(Timeline).seek(first)
        self.notify("jumped to the first finding", timeout=5)
