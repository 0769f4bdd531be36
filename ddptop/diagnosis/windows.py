"""The rate rules' windows: each settled rank's recent samples and their medians, once per diagnosis.

straggler and input_bound judge the same windows (the last ``window_s`` of every running
rank past its warm-up with at least ``min_samples`` samples) by the medians of the same
fields. At 32,768 ranks that is 32,768 windows: computed once per diagnosis
(:mod:`ddptop.diagnosis.memo`), the window a start index into the rank's history, and
each median from one list per field, scanned once in C for None, instead of a generator
that filters every sample.
The values are those :func:`ddptop.diagnosis.common.median` gives over a copied window.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter
from typing import cast

from ddptop.diagnosis.common import active, fresh_ranks
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.memo import shared
from ddptop.model.pace import EVERY, give_way
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample

_time = attrgetter("time")
_ready = attrgetter("loader_ready_batches")


@dataclass(frozen=True)
class Window:
    """A settled rank's window: ``samples[start:]``, with the medians both rate rules read."""

    samples: Sequence[Sample]
    start: int
    step_time_s: float | None  # median step time over the window
    data_wait: float | None  # median share of each step spent waiting for data

    def ready_batches(self) -> float | None:
        """Median batches prefetched in the DataLoader queue (input_bound only, for few ranks)."""
        return window_median(self.samples, self.start, _ready)


def settled(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
            config: DiagnosisConfig) -> dict[int, Window]:
    """Every running rank past its warm-up with ``min_samples`` in the window, in active order.

    A rank that just started or restarted, or has too few samples, has no "persistent"
    behaviour yet. Once per diagnosis (shared by straggler and input_bound).
    """
    return shared("settled", (snapshot, histories), (now, config),
                  lambda: _settled(snapshot, histories, now, config))


def _settled(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
             config: DiagnosisConfig) -> dict[int, Window]:
    out: dict[int, Window] = {}
    since_window = now - config.window_s
    empty: list[Sample] = []
    for i, s in enumerate(_judged(snapshot, now, config)):
        if not i % EVERY:  # a window's medians cost ~10 us a rank: 300 ms at 32,768 ranks
            give_way()
        window = _window(histories.get(s.rank, empty), s, since_window, config)
        if window is not None:
            out[s.rank] = window
    return out


def _judged(snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> list[RankState]:
    """The ranks the rate rules may judge: running, past warm-up, in active order."""
    fresh = fresh_ranks(snapshot, now, config)
    return [s for s in active(snapshot) if s.status == "running" and s.rank not in fresh]


def _window(samples: list[Sample], state: RankState, since_window: float,
            config: DiagnosisConfig) -> Window | None:
    # Samples taken after the rank's (re)start; histories are time-ordered.
    start = bisect.bisect_left(samples, max(since_window, state.start_time), key=_time)
    if len(samples) - start < config.min_samples:
        return None
    # Comprehensions rather than map(attrgetter): 3.11 specialises these attribute loads (~20%
    # less per window measured at 8,192 ranks; most of the rest is the samples' cache misses).
    window = samples[start:] if start else samples
    return Window(samples, start, median_of([x.step_time_s for x in window]),
                  median_of([x.data_wait_fraction for x in window]))


def window_median(samples: Sequence[Sample], start: int,
                  field: Callable[[Sample], float | int | None]) -> float | None:
    """Median of *field* over ``samples[start:]``, known values only (as ``common.median``)."""
    return median_of(list(map(field, islice(samples, start, None) if start else samples)))


def median_of(values: list[float | None] | list[int | None]) -> float | None:
    """Median of the known values of *values* (a list of its own: sorted in place), as
    ``common.median`` gives it, with one C-level scan for None instead of a filter per value."""
    # A None is rare (a step time before the first step): filter only then.
    known = cast("list[float]", [v for v in values if v is not None] if None in values else values)
    known.sort()
    n = len(known)
    if not n:
        return None
    mid = n // 2
    return float(known[mid]) if n % 2 else (known[mid - 1] + known[mid]) / 2
