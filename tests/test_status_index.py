"""JobModel.statuses from the incremental StatusIndex equals the full loop it replaced.

The index keeps each rank's word from the ranks ``apply`` marked dirty, turns ranks stale
through buckets of their receipt time, and resolves teardowns over the ended ranks only;
the reference is the old loop, kept as ``JobModel._statuses_full``. Random event streams,
read at random times (also going back in time, as a replay's seek does).
"""

from __future__ import annotations

import gc
import weakref

from hypothesis import given, settings
from hypothesis import strategies as st

from ddptop.digest import PulseBatch, pulse_of
from ddptop.model.job import JobModel
from ddptop.protocol import (
    ConnectionEvent,
    Message,
    RankExit,
    RankState,
    RecordEntry,
    StacksMsg,
    StateMsg,
    StuckReport,
)
from ddptop.status import STALE_AFTER_S, Status
from ddptop.tui.widgets.header import HeaderFacts, identity_by_loop

WORDS = ("running", "running", "starting", "exited", "crashed", "terminated")
times = st.floats(min_value=990.0, max_value=1010.0) | st.sampled_from(
    [1000.0, 1000.0 - STALE_AFTER_S, 1001.0 - STALE_AFTER_S, 999.5])


def _state(rank: int, t: float, status: str, reason: str) -> RankState:
    return RankState(rank=rank, local_rank=rank, world_size=8, host=f"h{rank % 2}", pid=100 + rank,
                     job_id="si", time=t, step=1, status=status, exit_reason=reason)


ranks = st.integers(min_value=0, max_value=11)
state_events = st.builds(
    lambda r, t, at, w, reason: RecordEntry(time=at, rank=r, message=StateMsg(state=_state(r, t, w, reason))),
    ranks, times, times, st.sampled_from(WORDS), st.sampled_from(["", "Connection reset by peer"]))
exit_events = st.builds(
    lambda r, t, code, sig: RankExit(time=t, rank=r, pid=100 + r, exit_code=code, signal=sig),
    ranks, times, st.none() | st.sampled_from([0, 1]), st.sampled_from(["", "SIGTERM", "SIGKILL", "SIGSEGV"]))
conn_events = st.builds(lambda r, t, s: ConnectionEvent(time=t, rank=r, status=s, reason="x"),
                        ranks, times, st.sampled_from([Status.CONNECTED.value, Status.STALE.value,
                                                       Status.LOST.value]))
stuck_events = st.builds(
    lambda r, t, at: RecordEntry(time=at, rank=r, message=StacksMsg.of_stuck(
        StuckReport(rank=r, pid=100 + r, time=t, since=t - 3.0, source="proc"))),
    ranks, times, times)
events = st.one_of(state_events, state_events, exit_events, conn_events, stuck_events)
steps = st.lists(st.tuples(events, st.none() | times), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_index_equals_the_full_loop_over_random_streams(stream: list[tuple[Message, float | None]]) -> None:
    model = JobModel("si", 8)
    for message, read_at in stream:
        model.apply(message)
        if read_at is not None:
            got = model.statuses(read_at)
            assert got == model._statuses_full(read_at)
            assert list(got) == sorted(got)
    for now in (990.0, 1000.0, 1000.0 + STALE_AFTER_S, 1020.0, 995.0):
        assert model.statuses(now) == model._statuses_full(now)


@settings(max_examples=200, deadline=None)
@given(steps, steps, times)
def test_a_shared_copy_takes_the_index_along_and_keeps_it_right(
        before: list[tuple[Message, float | None]], after: list[tuple[Message, float | None]],
        copied_at: float) -> None:
    """The background diagnosis's copy starts from its model's index (what it folded, and what
    it had yet to fold), not from nothing; both stay equal to the full loop as each goes on."""
    model = JobModel("si", 8)
    model.statuses(copied_at)  # the dashboard's model has its index from the first redraw
    for message, read_at in before:
        model.apply(message)
        if read_at is not None:
            model.statuses(read_at)  # some folded, the rest dirty when copied
    copy = model.shared_copy()
    assert copy._status_index is not None and copy._status_index is not model._status_index
    assert copy.statuses(copied_at) == copy._statuses_full(copied_at) == model._statuses_full(copied_at)
    for message, read_at in after:  # each goes its own way: the copy's index follows its own views
        copy.apply(message)
        if read_at is not None:
            assert copy.statuses(read_at) == copy._statuses_full(read_at)
            assert model.statuses(read_at) == model._statuses_full(read_at)


def test_a_silent_rank_turns_stale_with_time_alone() -> None:
    """No event after its last state: the clock alone makes it stale, then the next state
    makes it running again."""
    model = JobModel("si", 2)
    for r in (0, 1):
        model.apply(StateMsg(state=_state(r, 100.0, "running", "")))
    assert model.statuses(100.0 + STALE_AFTER_S) == {0: "running", 1: "running"}
    model.apply(StateMsg(state=_state(0, 104.0, "running", "")))
    assert model.statuses(100.5 + STALE_AFTER_S) == {0: "running", 1: "stale"}
    model.apply(StateMsg(state=_state(1, 106.0, "running", "")))
    assert model.statuses(106.0 + STALE_AFTER_S) == {0: "stale", 1: "running"}


def test_a_rank_its_agent_found_stuck_is_stale_at_once_until_it_answers() -> None:
    """The node agent's stuck report (read at silence, ~3 s) makes the rank stale when it
    arrives, not at STALE_AFTER_S: the wait was for that reason only. Its next state ends it."""
    model = JobModel("si", 2)
    for r in (0, 1):
        model.apply(StateMsg(state=_state(r, 100.0, "running", "")))
    assert model.statuses(103.0) == {0: "running", 1: "running"}
    report = StuckReport(rank=1, pid=101, time=103.4, since=100.0, source="py-spy")
    model.apply(RecordEntry(time=103.5, rank=1, message=StacksMsg.of_stuck(report)))
    assert model.statuses(103.5) == {0: "running", 1: "stale"}
    assert model.statuses(103.5) == model._statuses_full(103.5)
    assert model.ranks[1].status(103.5) == "stale"
    snap = model.snapshot(103.5)
    assert [(s.rank, s.status, s.stuck is not None) for s in snap.ranks] == [(0, "running", False),
                                                                             (1, "stale", True)]
    model.apply(StateMsg(state=_state(1, 104.0, "running", "")))  # it answers again
    assert model.statuses(104.0) == {0: "running", 1: "running"}
    assert model.statuses(100.5 + STALE_AFTER_S) == {0: "stale", 1: "running"}
    assert model.statuses(104.0) == model._statuses_full(104.0)


def test_each_consumer_owns_its_dirty_set() -> None:
    model = JobModel("si", 2)
    a, b = model.watch_dirty(), model.watch_dirty()
    model.apply(StateMsg(state=_state(1, 1.0, "running", "")))
    assert a == b == {1}
    a.clear()
    model.apply(RankExit(time=2.0, rank=0, pid=100, exit_code=0))
    assert a == {0} and b == {0, 1}
    assert model.copy().dirty_sinks == [] and model.shared_copy().dirty_sinks == []


ident_states = st.builds(
    lambda r, host, start, world, backend: StateMsg(state=RankState(
        rank=r, local_rank=r, world_size=world, host=host, pid=1, job_id="si", time=1.0, status="running",
        start_time=start, backend=backend)),
    ranks, st.sampled_from(["a", "b", "c", ""]), st.sampled_from([0.0, 5.0, 3.0, 9.0]),
    st.integers(min_value=0, max_value=16), st.sampled_from(["", "nccl", "gloo"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(ident_states, ident_states, exit_events, conn_events), st.booleans()),
                min_size=1, max_size=40))
def test_header_facts_equal_the_loop(stream: list[tuple[Message, bool]]) -> None:
    """The header's identity (start, world, hosts, backend) kept from dirty ranks equals the
    pass over every state, read after any prefix of the stream."""
    model = JobModel("si", 4)
    facts = HeaderFacts(model)
    for message, read in stream:
        model.apply(message)
        if read:
            assert facts.identity() == identity_by_loop(model)
    assert facts.identity() == identity_by_loop(model)


def _ident(r: int, host: str, start: float, world: int, backend: str) -> RankState:
    return RankState(rank=r, local_rank=r, world_size=world, host=host, pid=1, job_id="si", time=1.0,
                     status="running", start_time=start, backend=backend)


idents = st.builds(_ident, ranks, st.sampled_from(["a", "b", "c", ""]), st.sampled_from([0.0, 5.0, 3.0, 9.0]),
                   st.integers(min_value=0, max_value=16), st.sampled_from(["", "nccl", "gloo"]))
digest_steps = st.tuples(st.sampled_from(["pulse over the same detail", "pulse over a new detail", "merge",
                                          "state"]), idents, st.booleans())


@settings(max_examples=200, deadline=None)
@given(st.lists(digest_steps, min_size=1, max_size=40))
def test_header_facts_watch_details_only_and_still_equal_the_loop(
        stream: list[tuple[str, RankState, bool]]) -> None:
    """Through the digest lane: pulses over the detail object a view holds do not wake the
    header (its identity is detail), pulses over a new detail, whole states, and merges made
    by a reader (``RankView.state`` replaces the detail object) do; the identity equals the
    pass over every state after any prefix."""
    model = JobModel("si", 4)
    facts = HeaderFacts(model)
    details: dict[int, RankState] = {}  # what the digest lane last sent each rank over
    for kind, ident, read in stream:
        r = ident.rank
        if kind == "merge":
            if r in model.ranks:
                _ = model.ranks[r].state
            continue
        if kind == "state":
            model.apply(StateMsg(state=ident))
            details.pop(r, None)
            continue
        if kind == "pulse over a new detail" or r not in details:
            details[r] = ident
        detail = details[r]
        held = model.ranks[r].base if r in model.ranks else None
        woken = r in facts._dirty
        model.apply(PulseBatch(times=[2.0], details=[detail], pulses=[pulse_of(detail, 0.0)]))
        # The point: such a pulse leaves the header asleep (a merge made since wakes it).
        assert (r in facts._dirty) == (woken or held is not detail)
        if read:  # the loop over a copy: its reads merge the copy's views, not these
            assert facts.identity() == identity_by_loop(model.shared_copy())
    assert facts.identity() == identity_by_loop(model.shared_copy())


def test_a_model_that_was_read_is_freed_without_the_cyclic_collector() -> None:
    """The dashboard's background diagnosis drops a copy of the model after each run: freed
    by reference counting, not left to the cyclic collector (32,768 views at 32,768 ranks)."""
    model = JobModel()
    for r in range(8):
        running = _state(r, 1000.0, "running", "")
        model.apply(RecordEntry(time=1000.0, rank=r, message=StateMsg(state=running)))
    was_enabled = gc.isenabled()
    gc.disable()  # only reference counting frees what is dropped here
    try:
        copy = model.shared_copy()
        copy.snapshot(1000.0)  # asks the copy's status index
        model.statuses(1000.0)
        gone = [weakref.ref(copy), weakref.ref(model)]
        del copy, model
        assert [ref() for ref in gone] == [None, None]
    finally:
        if was_enabled:
            gc.enable()


def test_a_shared_copy_has_new_views_with_every_field_and_the_same_history() -> None:
    """The background diagnosis's copy: each view a new object with every field of the model's,
    the history deque itself shared; changing a copied view leaves the model's as it was."""
    model = JobModel("si", 2)
    model.apply(StateMsg(state=_state(1, 1.0, "running", "")))
    model.apply(RankExit(time=2.0, rank=0, pid=100, exit_code=0))
    copy = model.shared_copy()
    assert copy.ranks.keys() == model.ranks.keys()
    for rank, view in model.ranks.items():
        copied = copy.ranks[rank]
        assert copied is not view and copied == view and copied.history is view.history
    copy.ranks[1].connection = "lost"
    assert model.ranks[1].connection != "lost"
