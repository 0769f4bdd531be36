"""A rank's history in the model: a HistoryMsg merges with what is there, by time, each time once.

The first history of a rank (an attach: 32,768 of them) is taken as it comes when it is
in time order; any other is merged and sorted. Either way the result is the reference merge.
A big job's ranks share the viewer's budget of samples (ddptop.model.history): each keeps its
newest ``history_len(world_size)``, by every way a sample comes in.
"""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from ddptop.digest import PulseBatch, pulse_of
from ddptop.model.history import HISTORY_BUDGET, HISTORY_LEN, HISTORY_MIN, history_len
from ddptop.model.job import JobModel
from ddptop.protocol import HistoryMsg, RecordEntry, Sample, StateMsg
from tests.probes_tui.fakes import NOW, state


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


def test_a_big_job_s_ranks_share_the_budget() -> None:
    assert history_len(4) == HISTORY_LEN == 3600  # small jobs: an hour at 1 Hz, as always
    assert history_len(HISTORY_BUDGET // HISTORY_LEN) == HISTORY_LEN
    assert history_len(32768) == HISTORY_BUDGET // 32768 == 122  # two minutes at 1 Hz
    assert history_len(10**6) == HISTORY_MIN  # never below the rate rules' window


def _state_msg(rank: int, world: int, t: float) -> RecordEntry:
    return RecordEntry(time=t, rank=rank, message=StateMsg(state=state(rank, world=world, t=t)))


def test_each_way_in_keeps_the_newest_samples_of_the_budget() -> None:
    world = 32768
    keep = history_len(world)
    model = JobModel()
    # One rank first, from a small world's view of it: its ring shrinks when the world is known.
    for t in range(keep + 50):
        model.apply(_state_msg(0, 1, NOW + t))
    assert len(model.ranks[0].history) == keep + 50
    model.apply(_state_msg(1, world, NOW + 500))
    assert model.world_size == world
    assert [s.time for s in model.ranks[0].history] == [NOW + t for t in range(50, keep + 50)]
    # A reply's history (an attach) into a rank of the big world.
    samples = [sample(NOW + t, t) for t in range(1000)]
    model.apply(RecordEntry(time=NOW, rank=2, message=HistoryMsg(rank=2, samples=samples)))
    assert list(model.ranks[2].history) == samples[-keep:]
    # States, one a second, and the digest lane's pulses.
    for t in range(keep + 10):
        model.apply(_state_msg(3, world, NOW + t))
        detail = state(4, world=world, t=NOW + t)
        model.apply(PulseBatch(times=[NOW + t], details=[detail], pulses=[pulse_of(detail, 0.0)]))
    for rank in (3, 4):
        assert [s.time for s in model.ranks[rank].history] == [NOW + t for t in range(10, keep + 10)]
    assert all(v.history.maxlen == keep for v in model.ranks.values())
    assert all(v.history.maxlen == keep for v in model.copy().ranks.values())  # a replay checkpoint
