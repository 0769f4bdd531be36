"""Each rank's history in a viewer's model: how many samples it keeps, and how one grows.

A viewer keeps a ring of 1 Hz samples per rank (the rate rules' windows, the detail screen's
sparklines, a gone rank's "last seen at step N"). An hour of them per rank (:data:`HISTORY_LEN`)
is 3,600 samples of about 340 bytes with their boxed numbers: 1.2 MB a rank. At 32,768 ranks a
viewer grew by 10.8 MiB a second (``bench/viewer_memory.py``: +1,958 MiB after 180 s, 6.08 M
samples), on its way to 37 GiB. So a viewer keeps at most :data:`HISTORY_BUDGET` samples in
all: a job's ranks share it (:func:`history_len`), never fewer than :data:`HISTORY_MIN` each.
Up to 1,111 ranks nothing changes; at 32,768 ranks each keeps its last two minutes, and the
viewer stopped growing at +1,295 MiB (from 240 s to 480 s, measured). What a recording holds
is not capped here: ``ddptop record`` writes every state as it comes, and a replay's model of
one moment keeps what this budget allows of it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import pairwise

from ddptop.protocol import RankState, Sample

HISTORY_LEN = 3600  # samples kept per rank, at most (1 h at 1 Hz)
HISTORY_BUDGET = 4_000_000  # samples a viewer keeps in all (about 1.3 GiB)
# At least (2 min at 1 Hz): the rate rules judge a window of 30 s plus a margin, and a rank
# sampled faster than 1 Hz still fills that window.
HISTORY_MIN = 120


def history_len(world_size: int) -> int:
    """Samples each rank of a job of *world_size* ranks keeps."""
    return max(HISTORY_MIN, min(HISTORY_LEN, HISTORY_BUDGET // max(1, world_size)))


def ring(samples: Iterable[Sample] = (), keep: int = HISTORY_LEN) -> deque[Sample]:
    """A rank's history: the last *keep* of *samples* (time-ordered)."""
    return deque(samples, maxlen=keep)


def append_sample(history: deque[Sample], st: RankState) -> None:
    """*st*'s sample at the end of *history*, unless it is not newer than the last one."""
    if history and history[-1].time >= st.time:
        return
    history.append(Sample.of(st, st.time))


def merged_history(history: deque[Sample], samples: Sequence[Sample]) -> deque[Sample]:
    """*history* with a reply's *samples* (a rank's own ring, sent at an attach), by time; of
    two samples of one time the reply's wins. The ring keeps *history*'s length."""
    keep = history.maxlen if history.maxlen is not None else HISTORY_LEN
    if not history and all(a.time < b.time for a, b in pairwise(samples)):
        # An attach: the first history of each of 32,768 ranks, oldest first as a rank keeps
        # it; nothing to merge or sort.
        return ring(samples, keep)
    by_time = {s.time: s for s in history}
    by_time.update({s.time: s for s in samples})
    return ring(sorted(by_time.values(), key=lambda s: s.time), keep)


def resized(history: deque[Sample], keep: int) -> deque[Sample]:
    """*history* keeping *keep* samples (its newest), itself when it already does."""
    return history if history.maxlen == keep else ring(history, keep)
