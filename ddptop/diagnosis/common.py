"""Helpers shared by the rule modules: rank phases, robust statistics, text."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.memo import shared
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import CollectiveGroup, PendingOp, RankState
from ddptop.status import ACTIVE
from ddptop.status import ENDED as GONE
from ddptop.textfmt import human_duration, rank_ranges

__all__ = [
    "ACTIVE",
    "GONE",
    "active",
    "fresh_ranks",
    "group",
    "human_duration",
    "median",
    "op_age",
    "rank_ranges",
    "ranks_text",
]


def active(snapshot: JobSnapshot) -> list[RankState]:
    """Ranks still part of the job (starting, running or stale), by rank (do not mutate:
    within a diagnosis every rule gets the same list)."""
    return shared("active", (snapshot,), (), lambda: [s for s in snapshot.ranks if s.status in ACTIVE])


def fresh_ranks(snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> set[int]:
    """Ranks that (re)started recently: not to be judged on speed or on lagging peers.

    A rank is fresh while it is younger than ``warmup_s``, and also when its restart
    count is above the lowest in the job (torchelastic restarted it; its counters are
    from a new process and cannot be compared with its peers' yet). Shared by the rules of
    one diagnosis: do not mutate.
    """
    return shared("fresh", (snapshot,), (now, config), lambda: _fresh_ranks(snapshot, now, config))


def _fresh_ranks(snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> set[int]:
    states = active(snapshot)
    if not states:
        return set()
    low = min(s.restart_count for s in states)
    out: set[int] = set()
    for s in states:
        young = s.start_time > 0 and now - s.start_time < config.warmup_s
        if young or (s.restart_count > low and now - s.start_time < config.window_s):
            out.add(s.rank)
    return out


def median_without(ordered: Sequence[float], value: float) -> float | None:
    """Median of *ordered* (sorted) with one occurrence of *value* left out, in O(log n).

    The per-rank "median of the others" of the rules, without an O(n^2) rebuild.
    """
    n = len(ordered) - 1
    if n <= 0:
        return None
    skip = bisect.bisect_left(ordered, value)

    def at(i: int) -> float:  # i-th element of the list without the skipped one
        return ordered[i if i < skip else i + 1]

    mid = n // 2
    return at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2


def median(values: Iterable[float | int | None]) -> float | None:
    """Median of the known values; None when there are none."""
    # Called for every rank's window (thousands per diagnosis): no float() per value and no
    # statistics.median() overhead, just one sort and the middle.
    known = sorted([v for v in values if v is not None])
    n = len(known)
    if not n:
        return None
    mid = n // 2
    return float(known[mid]) if n % 2 else (known[mid - 1] + known[mid]) / 2


def group(state: RankState, pg: str) -> CollectiveGroup | None:
    """The rank's process group named *pg*, if it reported one."""
    for g in state.collectives:
        if g.pg == pg:
            return g
    return None


def op_age(op: PendingOp, state: RankState, now: float) -> float:
    """Age of a pending op at *now*: its age when sampled plus the time since the sample."""
    return op.age_s + max(0.0, now - state.time) if state.time else op.age_s


def ranks_text(ranks: Iterable[int]) -> str:
    """'rank 3' or 'ranks 0-2,5' for a set of ranks."""
    ordered = sorted(set(ranks))
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {rank_ranges(ordered)}"
