"""Helpers shared by the rule modules: rank phases, robust statistics, text."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import CollectiveGroup, PendingOp, RankState, Sample
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
    "window",
]


def active(snapshot: JobSnapshot) -> list[RankState]:
    """Ranks still part of the job (starting, running or stale), by rank."""
    return [s for s in snapshot.ranks if s.status in ACTIVE]


def fresh_ranks(snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> set[int]:
    """Ranks that (re)started recently: not to be judged on speed or on lagging peers.

    A rank is fresh while it is younger than ``warmup_s``, and also when its restart
    count is above the lowest in the job (torchelastic restarted it; its counters are
    from a new process and cannot be compared with its peers' yet).
    """
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


def settled_windows(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                    config: DiagnosisConfig) -> dict[int, list[Sample]]:
    """Recent samples of every running rank past its warm-up that has enough of them.

    The rate rules (straggler, input-bound) judge only these: a rank that just started or
    restarted, or has too few samples, has no "persistent" behaviour yet.
    """
    fresh = fresh_ranks(snapshot, now, config)
    out: dict[int, list[Sample]] = {}
    for s in active(snapshot):
        if s.rank in fresh or s.status != "running":
            continue
        samples = window(histories.get(s.rank, []), s, now, config.window_s)
        if len(samples) >= config.min_samples:
            out[s.rank] = samples
    return out


def window(samples: Sequence[Sample], state: RankState, now: float, span_s: float) -> list[Sample]:
    """Samples of the last *span_s* seconds taken after the rank's (re)start."""
    since = max(now - span_s, state.start_time)
    # Histories are time-ordered: bisect instead of scanning 600 samples x thousands of ranks.
    return list(samples[bisect.bisect_left(samples, since, key=_sample_time):])


def _sample_time(sample: Sample) -> float:
    return sample.time


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
