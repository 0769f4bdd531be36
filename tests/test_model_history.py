"""A rank's history in the model: a HistoryMsg merges with what is there, by time, each time once.

The first history of a rank (an attach: 32,768 of them) is taken as it comes when it is
in time order; any other is merged and sorted. Either way the result is the reference merge.
"""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from ddptop.model.job import HISTORY_LEN, JobModel
from ddptop.protocol import HistoryMsg, RecordEntry, Sample


def sample(t: float, step: int = 0) -> Sample:
    return Sample(time=t, step=step, epoch=0, batch=0, seq=0, step_time_s=None, data_wait_fraction=None,
                  loader_ready_batches=None, cpu_percent=None, rss_bytes=None, gpu_util_percent=None)


def reference(before: list[Sample], incoming: list[Sample]) -> list[Sample]:
    merged = {s.time: s for s in before}
    merged.update({s.time: s for s in incoming})
    return list(deque(sorted(merged.values(), key=lambda s: s.time), maxlen=HISTORY_LEN))


times = st.lists(st.integers(0, 50).map(float), max_size=30)


@settings(max_examples=200, deadline=None)
@given(times, times)
def test_history_merges_like_the_reference(first: list[float], second: list[float]) -> None:
    # Steps tell samples of one time apart: the later one of a time wins, as in the reference.
    one = [sample(t, i) for i, t in enumerate(first)]
    two = [sample(t, 100 + i) for i, t in enumerate(second)]
    model = JobModel()
    model.apply(RecordEntry(time=0.0, rank=3, message=HistoryMsg(rank=3, samples=one)))
    assert list(model.ranks[3].history) == reference([], one)
    model.apply(RecordEntry(time=0.0, rank=3, message=HistoryMsg(rank=3, samples=two)))
    assert list(model.ranks[3].history) == reference(reference([], one), two)
