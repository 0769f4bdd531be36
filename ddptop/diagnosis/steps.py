"""Growth in steps: a filesystem filled one checkpoint (shard, log roll) at a time (#55).

Pure: the levels a rank kept of its checkpoint disk (``RankState.disk_levels``: its use each
time it moved by a step, read right after each ``torch.save`` returns) in, a :class:`StepGrowth`
(or None) out. A disk filled by saves minutes apart is flat between two saves and jumps at
each: a slope over the last minute sees nothing, or a cliff. So the rises themselves are
judged: the newest run of rises alike in size and spacing (:data:`MIN_RISES` at least: the
first saves of a job that keeps its last N look like a job that keeps them all until the first
is deleted), what of them stayed (a rotation deletes what a save added: nothing stays), and
from those, how many more saves fit and when the first that does not is due. The forecast
holds between two saves (it moves only when a save lands); it is withdrawn when the saves stop
(no rise for :data:`STOPPED_AFTER` spacings), never because one sample came late.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median

MIN_RISES = 4  # the newest run of alike rises holds at least this many
MAX_RISES = 8  # ... and is judged over at most this many
MERGE_S = 3.0  # rises closer than this are one save read mid-way
ALIKE = 2.0  # a rise (its size, its spacing) within this factor of the run's median
KEPT_SHARE = 0.5  # of what the run's saves added, at least this much stayed
STOPPED_AFTER = 2.5  # spacings without a rise: the growth stopped
HORIZON_SAVES = 2  # warned this many spacings ahead at least: saves 10 minutes apart, 20 minutes ahead
HELD_SAVES = 3  # a warning made at one of the last this many saves holds ...
HELD_SHARE = 1.5  # ... while the failing save is due within this share of the horizon


@dataclass(frozen=True, slots=True)
class StepGrowth:
    """Saves alike in size and spacing, heading for a filesystem's limit."""

    step: float  # bytes one save adds while it is written (the run's median rise)
    kept: float  # bytes of each save that stay (the rotated part left out), > 0
    every_s: float  # the median spacing of the saves
    rises: int  # saves in the run judged
    last_at: float  # wall clock of the newest save
    used: float
    limit: float
    fit: int  # more saves that fit
    due_at: float  # wall clock the first save that does not fit is due
    at: float  # the time the forecast is for

    @property
    def eta_s(self) -> float:
        return max(0.0, self.due_at - self.at)

    @property
    def rate(self) -> float:
        """The kept bytes per second: the average pace of the growth."""
        return self.kept / self.every_s


def rises(levels: Sequence[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """(wall clock, bytes added, use before) of each rise between kept levels, those read less
    than MERGE_S apart joined (a save read mid-way and at its end)."""
    out: list[tuple[float, float, float]] = []
    for (_, before), (t, after) in pairwise(levels):
        if after <= before:
            continue
        if out and t - out[-1][0] < MERGE_S:
            _, added, base = out[-1]
            out[-1] = (t, added + after - before, base)
        else:
            out.append((t, after - before, before))
    return out


def step_growth(levels: Sequence[tuple[float, float]], limit: float | None, now: float,
                since: float = 0.0) -> StepGrowth | None:
    """The growth of *levels* (time-ordered (wall clock, used)) towards *limit* at *now*; None
    where no run of alike saves after *since* keeps growing. The use is the newest level's, not
    the newest read: a read while a save is written would move the count of saves that fit."""
    if not limit or limit <= 0:
        return None
    known = [(t, v) for t, v in levels if t <= now]
    if not known:
        return None
    used = known[-1][1]
    found = [r for r in rises(known) if r[0] >= since][-MAX_RISES - 1:]
    if len(found) > MIN_RISES and found[-1][1] < median(r[1] for r in found) / ALIKE:
        # The newest rise is smaller than a save: one read mid-way (its end is read next, and
        # joined to it): the forecast stays what the saves before it made it.
        used = found.pop()[2]
    found = found[-MAX_RISES:]
    if len(found) < MIN_RISES:
        return None
    size = median(r[1] for r in found)
    spacing = median(b[0] - a[0] for a, b in pairwise(found))
    if spacing <= 0:
        return None
    run = [found[-1]]  # the newest run of rises alike in size and spacing, newest last
    for r in reversed(found[:-1]):
        gap = run[0][0] - r[0]
        if not (size / ALIKE <= r[1] <= size * ALIKE and spacing / ALIKE <= gap <= spacing * ALIKE):
            break
        run.insert(0, r)
    if len(run) < MIN_RISES or not size / ALIKE <= run[-1][1] <= size * ALIKE:
        return None
    last = run[-1][0]
    if now - last > STOPPED_AFTER * spacing:
        return None  # the saves stopped
    kept = (used - run[0][2]) / len(run)
    if kept < KEPT_SHARE * size:
        return None  # rotated: what a save adds, a deletion takes away
    free = limit - used
    # The n-th save from now needs room for its whole write on top of what the n-1 before kept.
    fit = 0 if free < size else int((free - size) // kept) + 1
    return StepGrowth(step=size, kept=kept, every_s=spacing, rises=len(run), last_at=last, used=used,
                      limit=limit, fit=fit, due_at=last + (fit + 1) * spacing, at=now)


def warns(growth: StepGrowth, warning_s: float) -> bool:
    """Whether *growth*'s failing save is near enough to warn of: within *warning_s* (as a trend
    is), or within HORIZON_SAVES spacings where saves are further apart than that allows."""
    return growth.eta_s < _horizon(growth, warning_s)


def _horizon(growth: StepGrowth, warning_s: float) -> float:
    return max(warning_s, HORIZON_SAVES * growth.every_s)


def judged(levels: Sequence[tuple[float, float]], limit: float | None, now: float, since: float,
           warning_s: float) -> tuple[StepGrowth | None, bool]:
    """:func:`step_growth` at *now*, and whether it warns. A warning once made holds: where the
    forecast of one of the last HELD_SAVES saves warned before the next save came, the forecast still
    warns while its failing save is due within HELD_SHARE of the horizon (each save moves the
    spacings' median a little: a due time near the horizon would come and go with them)."""
    growth = step_growth(levels, limit, now, since)
    if growth is None:
        return None, False
    if warns(growth, warning_s):
        return growth, True
    if growth.eta_s >= HELD_SHARE * _horizon(growth, warning_s):
        return growth, False
    until = growth.last_at  # the forecast each save before made, just before the next came
    for _ in range(HELD_SAVES):
        prior = [lv for lv in levels if lv[0] < until]
        before = step_growth(prior, limit, until - 1e-3, since)
        if before is None:
            break
        if warns(before, warning_s):
            return growth, True
        until = before.last_at
    return growth, False


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
