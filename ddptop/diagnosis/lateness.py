"""Who enters collectives late: the compute straggler that synchronous DDP hides.

In DDP every rank's step takes as long as the slowest rank's, and a rank slow in compute
does not wait for data either, so step times and data-wait shares look alike everywhere.
What differs is *when* each rank enters the same collective: the slow rank enqueues
seq N long after its peers, who then wait for it. Ranks report the wall-clock enqueue
time of the same milestone seqs (``CollectiveGroup.enqueue_times``), and this module
compares them. It assumes host clocks agree within a few ms (NTP), as torch's own
Flight Recorder analysis does.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ddptop.diagnosis.common import group
from ddptop.model.snapshot import JobSnapshot

MIN_COMMON_SEQS = 4  # milestones every compared rank reported


@dataclass(frozen=True)
class Lateness:
    """A rank's median delay entering collectives, behind the first rank to enter each."""

    median_s: float
    collectives: int  # how many common collectives the median is over
    first_seq: int
    last_seq: int


def entry_lateness(snapshot: JobSnapshot, ranks: set[int], pg: str = "0") -> dict[int, Lateness]:
    """Median lateness of each rank in *ranks* over the milestones all of them reported."""
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
    return {rank: Lateness(statistics.median(d), len(seqs), seqs[0], seqs[-1])
            for rank, d in delays.items()}
