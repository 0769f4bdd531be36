"""SlicedCopy: a shared copy taken a slice at a time, the model changing between the slices,
is the model of its last step, as ``shared_copy()`` taken then gives it.

Random event streams (states, digest pulses, exits, connections, stuck reports, a job that
grows), some before the copy begins and some between its steps, at random slice sizes; the
copy is compared view by view and status by status with a plain ``shared_copy()`` of the
model at the moment the copy says it is done.
"""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from ddptop.digest import PulseBatch, pulse_of
from ddptop.model.job import JobModel
from ddptop.model.rank_view import RankView
from ddptop.model.sliced_copy import SlicedCopy
from ddptop.protocol import Message, RankState, StateMsg
from tests.test_status_index import _state, events, ranks, times


def _pulse(rank: int, t: float, world: int) -> PulseBatch:
    detail = RankState(rank=rank, local_rank=rank, world_size=world, host="h", pid=100 + rank,
                       job_id="si", time=t - 1.0, step=1, status="running")
    later = msgspec.structs.replace(detail, time=t, step=2)
    return PulseBatch(times=[t], details=[detail], pulses=[pulse_of(later, 0.0)])


pulses = st.builds(_pulse, ranks, times, st.sampled_from([8, 8, 8, 16]))  # 16: the job grows
grows = st.builds(lambda r, t: StateMsg(state=RankState(rank=r, local_rank=0, world_size=24, host="h",
                                                        pid=1, job_id="si", time=t, status="running")),
                  st.integers(min_value=12, max_value=23), times)
changes = st.one_of(events, events, pulses, grows)


def _fields(view: RankView) -> dict[str, object]:
    fields = {f.name: getattr(view, f.name) for f in dataclasses.fields(view)
              if f.name not in ("base", "pulse")}
    fields["state"] = view.state  # a pulse merged (the original's may have been merged since)
    fields["history"] = id(view.history)  # shared, not copied
    return fields


@settings(max_examples=300, deadline=None)
@given(st.lists(changes, max_size=20), st.lists(st.lists(changes, max_size=4), max_size=12),
       st.integers(min_value=1, max_value=5), times, st.booleans())
def test_the_copy_is_the_model_of_its_last_step(before: list[Message], between: list[list[Message]],
                                                slice_ranks: int, now: float, indexed: bool) -> None:
    model = JobModel("si", 8)
    if indexed:
        model.statuses(now)  # the dashboard's model has its status index: the copy takes it along
    for message in before:
        model.apply(message)
    copier = SlicedCopy(model, slice_ranks)
    copied = None
    for step in range(200):
        copied = copier.step()
        if copied is not None:
            break
        for message in between[step] if step < len(between) else []:
            model.apply(message)
    assert copied is not None and not copier.watching and copier.step() is None
    assert len(model.dirty_sinks) == (1 if indexed else 0)  # the copy no longer watches
    want = model.shared_copy()
    assert list(copied.ranks) == list(model.ranks)
    for rank, view in copied.ranks.items():
        assert view is not model.ranks[rank]
        assert _fields(view) == _fields(want.ranks[rank]), rank
    assert (copied.job_id, copied.world_size, copied.first_time, copied.last_time) == \
        (model.job_id, model.world_size, model.first_time, model.last_time)
    assert copied.statuses(now) == copied._statuses_full(now) == model._statuses_full(now)


def test_a_slice_a_step_then_the_copy() -> None:
    model = JobModel("si", 8)
    for r in range(5):
        model.apply(StateMsg(state=_state(r, 1.0, "running", "")))
    copier = SlicedCopy(model, slice_ranks=2)
    assert [copier.step() for _ in range(3)] == [None, None, None]  # ranks 0-1, 2-3, 4
    assert copier.watching
    model.apply(StateMsg(state=_state(1, 2.0, "running", "")))  # copied in the first slice: again
    copied = copier.step()
    assert copied is not None and copier.steps == 4
    assert copied.ranks[1].state == model.ranks[1].state and copied.ranks[1].received_at == 2.0


def test_cancel_stops_watching() -> None:
    model = JobModel("si", 8)
    model.apply(StateMsg(state=_state(0, 1.0, "running", "")))
    copier = SlicedCopy(model)
    assert copier.watching
    copier.cancel()
    assert not copier.watching and model.dirty_sinks == [] and copier.step() is None


def test_a_job_that_grows_meanwhile_is_copied_with_its_resized_histories() -> None:
    """A bigger world shares the history budget: every rank's ring is replaced, though only the
    rank that told it changed. The copy shares the new rings, not the old ones."""
    model = JobModel("si", 4)
    for r in range(4):
        model.apply(StateMsg(state=_state(r, 1.0, "running", "")))
    copier = SlicedCopy(model, slice_ranks=2)
    assert copier.step() is None and copier.step() is None  # every view copied
    big = msgspec.structs.replace(_state(0, 2.0, "running", ""), world_size=4000)
    model.apply(StateMsg(state=big))
    assert model.ranks[3].history.maxlen != copier._views[3].history.maxlen  # the ring was replaced
    copied = copier.step()
    assert copied is not None
    assert all(copied.ranks[r].history is model.ranks[r].history for r in range(4))
