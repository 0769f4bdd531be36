"""Where a resource's use is heading: a robust slope over a window, and the time to its limit.

Pure: a list of (time, used) points in, a :class:`Trend` (or None) out. Memory in a training
loop is a sawtooth (activations and gradients come and go every step) on top of what the job
keeps; a warm-up rises, then levels off (allocator caches, the first epoch's workers). Neither
is heading for a limit. So the window is cut into equal buckets and only each bucket's
*minimum* is kept: the floor the sawtooth returns to. The floor's slope is the median of the
slopes between every pair of buckets (Theil-Sen: one odd bucket moves it little); it counts
only when the floor rose in most steps from bucket to bucket, and when its newest half rises
at least half as fast as the whole (a warm-up that levels off decelerates; a leak does not).
The time to the limit is measured from the newest bucket's *peak*: the OOM killer acts on
the top of the sawtooth, not on its floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median

WINDOW_S = 300.0  # the newest five minutes are judged
MIN_SPAN_S = 20.0  # a floor seen over less than this tells nothing
BUCKETS = 8
MIN_BUCKETS = 5  # buckets with a point in them, at least
RISING_SHARE = 0.75  # of the steps from one bucket's floor to the next, at least this many rise
STEADY_SHARE = 0.5  # the newest half's slope against the whole window's, at least


@dataclass(frozen=True, slots=True)
class Trend:
    """A floor rising towards a limit."""

    rate: float  # units (bytes) per second, > 0
    used: float  # the newest bucket's peak
    limit: float
    eta_s: float  # seconds from the newest point until ``used`` reaches ``limit`` at ``rate``
    at: float  # the newest point's time: the ETA's origin
    span_s: float  # the time the judged floor covers

    @property
    def reaches_at(self) -> float:
        """Wall clock the limit is reached at this rate."""
        return self.at + self.eta_s


def floors(points: Sequence[tuple[float, float]], window_s: float = WINDOW_S,
           buckets: int = BUCKETS) -> list[tuple[float, float, float]]:
    """(time of the floor, floor, peak) of each non-empty bucket of the newest *window_s*."""
    if not points:
        return []
    end = points[-1][0]
    start = max(points[0][0], end - window_s)
    width = (end - start) / buckets
    if width <= 0:
        return []
    low: list[tuple[float, float] | None] = [None] * buckets
    high: list[float] = [0.0] * buckets
    for t, v in reversed(points):  # newest first: stop at the window's start
        if t < start:
            break
        i = min(buckets - 1, int((t - start) / width))
        cur = low[i]
        if cur is None or v <= cur[1]:
            low[i] = (t, v)
        if cur is None or v > high[i]:
            high[i] = v
    return [(lo[0], lo[1], high[i]) for i, lo in enumerate(low) if lo is not None]


def _slope(pts: Sequence[tuple[float, float]]) -> float:
    """Theil-Sen: the median of the pairwise slopes."""
    slopes = [(b[1] - a[1]) / (b[0] - a[0]) for i, a in enumerate(pts) for b in pts[i + 1:] if b[0] > a[0]]
    return median(slopes) if slopes else 0.0


def trend(points: Sequence[tuple[float, float]], limit: float | None, window_s: float = WINDOW_S,
          min_span_s: float = MIN_SPAN_S) -> Trend | None:
    """The trend of *points* (time-ordered (time, used)) towards *limit*, or None where the floor
    is not steadily rising (flat, noisy, levelling off) or there is too little of it to tell."""
    if not limit or limit <= 0 or len(points) < MIN_BUCKETS:
        return None
    buckets = floors(points, window_s)
    if len(buckets) < MIN_BUCKETS or buckets[-1][0] - buckets[0][0] < min_span_s * (1 - 1 / BUCKETS):
        return None
    rises = sum(1 for a, b in pairwise(buckets) if b[1] > a[1])
    if rises < RISING_SHARE * (len(buckets) - 1):
        return None
    pts = [(t, lo) for t, lo, _ in buckets]
    rate = _slope(pts)
    if rate <= 0:
        return None
    recent = _slope(pts[len(pts) // 2:])
    if recent < STEADY_SHARE * rate:
        return None  # levelling off
    rate = min(rate, recent) if recent > 0 else rate
    at, used = points[-1][0], max(buckets[-1][2], points[-1][1])
    eta = max(0.0, (limit - used) / rate)
    return Trend(rate=rate, used=used, limit=limit, eta_s=eta, at=at,
                 span_s=buckets[-1][0] - buckets[0][0])
