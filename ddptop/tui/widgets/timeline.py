"""Replay timeline: a position in [start, end], stepping through recorded moments, playback.

The widget owns the position and the playback timer; whenever the position moves it
posts :class:`Timeline.Moved` and the app asks the source for ``model_at(t)``.
"""

from __future__ import annotations

import bisect
import time

from rich.text import Text
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Static

from ddptop.textfmt import human_duration

SPEEDS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
TICK_S = 0.25
BAR_WIDTH = 60


def timeline_text(t: float, start: float, end: float, speed: float, playing: bool,
                  marks: list[float] | None = None, width: int = BAR_WIDTH) -> Text:
    """'▶ 12:03:04 +45.0s/5m00s [━━━━●────] 2x' with finding marks as '!'."""
    span = max(end - start, 1e-9)
    pos = round((t - start) / span * (width - 1))
    cells = ["─"] * width
    for m in marks or []:
        if start <= m <= end:
            cells[round((m - start) / span * (width - 1))] = "!"
    for i in range(pos):
        if cells[i] == "─":
            cells[i] = "━"
    cells[max(0, min(width - 1, pos))] = "●"
    text = Text()
    text.append(" ▶ PLAYING " if playing else " ⏸ PAUSED  ", style="bold magenta" if playing else "bold")
    text.append(time.strftime("%H:%M:%S", time.localtime(t)) + f" +{human_duration(t - start)}"
                f" / {human_duration(end - start)} ")
    text.append("".join(cells), style="magenta")
    text.append(f" {speed:g}x")
    return text


class Timeline(Static):
    """Position in a recording; left/right step, home/end, play at a chosen speed."""

    class Moved(Message):
        """The position changed to *t*; replaces an older unprocessed move."""

        def __init__(self, t: float) -> None:
            super().__init__()
            self.t = t

        def can_replace(self, message: Message) -> bool:
            """Only the newest position matters."""
            return isinstance(message, Timeline.Moved)

    def __init__(self, start: float, end: float, times: list[float], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.start, self.end = start, max(end, start)
        self.times = sorted(times) or [start, self.end]
        self.t = self.end
        self.speed = 1.0
        self.playing = False
        self.marks: list[float] = []
        self._timer: Timer | None = None

    def on_mount(self) -> None:
        """Start the (paused) playback clock and draw."""
        self._timer = self.set_interval(TICK_S, self._tick)
        self._draw()

    def _draw(self) -> None:
        self.update(timeline_text(self.t, self.start, self.end, self.speed, self.playing, self.marks))

    def seek(self, t: float) -> float:
        """Move to *t* (clamped) and announce it; returns the new position."""
        self.t = max(self.start, min(self.end, t))
        self._draw()
        self.post_message(self.Moved(self.t))
        return self.t

    def step(self, n: int) -> float:
        """Move *n* recorded moments forward (negative: back)."""
        if n > 0:
            idx = bisect.bisect_right(self.times, self.t) + n - 1
        else:
            idx = bisect.bisect_left(self.times, self.t) + n
        idx = max(0, min(len(self.times) - 1, idx))
        return self.seek(self.times[idx])

    def toggle_play(self) -> bool:
        """Start/stop playback (from the start if at the end); returns True when playing."""
        self.playing = not self.playing
        if self.playing and self.t >= self.end:
            self.seek(self.start)
        self._draw()
        return self.playing

    def change_speed(self, delta: int) -> float:
        """Next/previous speed of :data:`SPEEDS`; returns it."""
        idx = SPEEDS.index(self.speed) if self.speed in SPEEDS else 1
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, idx + delta))]
        self._draw()
        return self.speed

    def _tick(self) -> None:
        if not self.playing:
            return
        if self.t >= self.end:
            self.playing = False
            self._draw()
            return
        self.seek(self.t + TICK_S * self.speed)
