"""Who enters collectives late: the compute straggler that synchronous DDP hides.

In DDP every rank's step takes as long as the slowest rank's, and a rank slow in compute
does not wait for data either, so step times and data-wait shares look alike everywhere.
What differs is *when* each rank enters the same collective: the slow rank enqueues
seq N long after its peers, who then wait for it. Ranks report the wall-clock enqueue
time of the same seqs (``CollectiveGroup.enqueue_times``), and this module compares
them. It assumes host clocks agree within a few ms (NTP), as torch's own Flight Recorder
analysis does.

A step often holds collectives of two kinds: those the straggler's slow compute delays (DDP's
bucket all-reduces) and those every rank enters together right after (a loss or stop flag
all-reduced once the gradients are in). A median over both kinds flips with their mix, so a
rank's lateness is the upper quartile of its delays: a rank late in a quarter of the
collectives or more is late by that much; one hiccup, or jitter, is not.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ddptop.diagnosis.common import group
from ddptop.model.snapshot import JobSnapshot

MIN_COMMON_SEQS = 4  # milestones every compared rank reported


@dataclass(frozen=True)
class Lateness:
    """A rank's delay entering collectives behind the first rank to enter each (upper quartile)."""

    late_s: float
    collectives: int  # how many common collectives the median is over
    first_seq: int
    last_seq: int


def entry_lateness(snapshot: JobSnapshot, ranks: set[int], pg: str = "0") -> dict[int, Lateness]:
    """Lateness of each rank in *ranks* over the seqs all of them reported."""
    times: dict[int, dict[int, float]] = {}
    for state in snapshot.ranks:
        if state.rank not in ranks:
            continue
        g = group(state, pg)
        if g is not None and g.enqueue_times:
            times[state.rank] = dict(g.enqueue_times)
    if len(times) < 2:
        return {}
    common = set.intersection(*(set(t) for t in times.values()))
    if len(common) < MIN_COMMON_SEQS:
        return {}
    seqs = sorted(common)
    delays: dict[int, list[float]] = {rank: [] for rank in times}
    for seq in seqs:
        first = min(t[seq] for t in times.values())
        for rank, t in times.items():
            delays[rank].append(t[seq] - first)
    return {rank: Lateness(upper_quartile(d), len(seqs), seqs[0], seqs[-1])
            for rank, d in delays.items()}


def upper_quartile(values: list[float]) -> float:
    """The 75th percentile of *values* (at least one), interpolated between the nearest two."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=4, method="inclusive")[2]
