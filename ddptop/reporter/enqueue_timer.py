"""When this rank enqueued its collectives, learnt without a Flight Recorder dump.

The straggler rule (:mod:`ddptop.diagnosis.lateness`) compares across ranks the wall-clock
moment each rank enqueued the same collective: the rank that enters late is the one the
others wait for. A full Flight Recorder dump knows those moments to the nanosecond, but it
is one C++ call that holds the GIL for 10-90 ms, and the training thread waits for it. In a
synchronous job a pause on any rank delays the step for all, so at a few hundred ranks some
rank pauses in every step (#57).

So the moments are observed instead. In short bursts, every rank polls each group's
sequence number (``_get_sequence_number_for_group``: a counter read, about a microsecond
with the GIL, which the poller drops between polls) every ``POLL_S``, and notes when the
number moved: seq *s* was enqueued between the poll before and the poll that saw it. The
bursts start on wall-clock ticks that every rank shares (multiples of the cadence), so all
ranks watch the same window, see the same seqs, and the little they cost is paid by the job
once, at the same moment, instead of rank after rank.

Precision is the poll's spacing (about 4 ms), far below the lateness that names a
straggler (tens of ms and more); a move seen after a longer gap (the poller waited for the
GIL) is not timed at all.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

POLL_S = 0.004  # spacing of the polls within a burst
BURST_S = 1.5  # a burst ends after this long at the most ...
BURST_SEQS = 32  # ... or once some group's seq moved this many times (enough to compare ranks)
MAX_GAP_S = 0.02  # a move seen after a longer gap between two polls is not timed
MAX_MOVE = 64  # nor one of more seqs at once (a group rebuilt, a seq reset)
# In the first minute of the job the bursts come every EARLY_EVERY_S, so a straggler is named
# without waiting for the cadence; the cadence's ticks (30 s) are ticks of this one as well.
EARLY_EVERY_S = 10.0
EARLY_FOR_S = 60.0
KEPT_PER_GROUP = 64  # moments kept between two takes, per group (the newest)
MAX_GROUPS = 64  # groups polled (a job with thousands of subgroups: the first, the default among them)

Polls = list[tuple[float, int]]


def next_tick(wall: float, every_s: float) -> float:
    """The first wall-clock multiple of *every_s* after *wall*: the same instant on every rank."""
    return (math.floor(wall / every_s) + 1) * every_s


def next_sample_at(interval: float) -> float:
    """The monotonic time of the next wall-clock multiple of *interval*.

    Every rank samples on the same ticks (their clocks agree to a few ms), so the short
    pauses a sample costs the training thread overlap across the job: a synchronous step
    pays them once, not once per rank (#57). A tick closer than a quarter interval is
    skipped, so a late sample is never followed by another at once.
    """
    wall = time.time()
    delay = interval - wall % interval
    if delay < interval / 4:
        delay += interval
    return time.monotonic() + delay


def moves(polls: Polls, max_gap_s: float = MAX_GAP_S, max_move: int = MAX_MOVE) -> dict[int, float]:
    """Seq -> when it was enqueued, from ``(wall time, seq)`` polls oldest first.

    A seq that first shows at a poll was enqueued after the poll before it: the moment is
    the middle of the two (every rank polls alike, so the half-gap cancels across ranks).
    Moves seen after a gap over *max_gap_s*, or of more than *max_move* seqs, are not timed.
    """
    out: dict[int, float] = {}
    for (t_prev, s_prev), (t, s) in itertools.pairwise(polls):
        if s <= s_prev or s - s_prev > max_move or t - t_prev > max_gap_s:
            continue
        middle = (t_prev + t) / 2
        for seq in range(s_prev + 1, s + 1):
            out[seq] = middle
    return out


class EnqueueTimer:
    """A daemon thread that watches the groups' seqs in bursts on shared wall-clock ticks.

    *groups* returns ``(group name, process group)`` pairs (read anew at each burst: groups
    come and go); *on_error* counts what failed, which never reaches training.
    """

    def __init__(self, every_s: float, groups: Callable[[], list[tuple[str, Any]]],
                 on_error: Callable[[BaseException], None]) -> None:
        self.every_s = every_s
        self._groups = groups
        self._on_error = on_error
        self._lock = threading.Lock()
        self._marks: dict[str, dict[int, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self.bursts = 0
        self.polls = 0

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is not None:
            return
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="ddptop-enqueue-timer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (it is a daemon: never joined for long)."""
        self._stop.set()

    def take(self) -> dict[str, dict[int, float]]:
        """The moments observed since the last take, per group name."""
        with self._lock:
            marks, self._marks = self._marks, {}
        return marks

    def _cadence(self) -> float:
        early = time.monotonic() - self._started < EARLY_FOR_S
        return min(EARLY_EVERY_S, self.every_s) if early else self.every_s

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                now = time.time()
                if self._stop.wait(next_tick(now, self._cadence()) - now):
                    return
                self._burst()
            except Exception as exc:  # count, carry on: a group torn down mid-burst, a torch internal moved
                self._on_error(exc)
                self._stop.wait(1.0)

    def _seqs(self) -> list[tuple[str, int]]:
        # The groups are read anew at every poll and let go at once: a group that this thread
        # kept alive past destroy_process_group would be destroyed here, joining gloo's threads
        # with the GIL held (the torch 2.13 teardown deadlock, see progress._patch_teardown).
        return [(name, int(pg._get_sequence_number_for_group())) for name, pg in self._groups()[:MAX_GROUPS]]

    def _burst(self) -> None:
        polls: dict[str, Polls] = {}
        end = time.monotonic() + BURST_S
        while not self._stop.is_set():
            seqs = self._seqs()
            t = time.time()  # after the reads: a seq seen here was enqueued before t
            if not seqs:
                break  # no group (yet, or any more)
            self.polls += 1
            for name, seq in seqs:
                polls.setdefault(name, []).append((t, seq))
            if time.monotonic() >= end or max(p[-1][1] - p[0][1] for p in polls.values()) >= BURST_SEQS:
                break
            time.sleep(POLL_S)
        self.bursts += 1
        observed = {name: moves(p) for name, p in polls.items()}
        with self._lock:
            for name, marks in observed.items():
                if not marks:
                    continue
                kept = self._marks.setdefault(name, {})
                kept.update(marks)
                for seq in sorted(kept)[:-KEPT_PER_GROUP]:
                    del kept[seq]
