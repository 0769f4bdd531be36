"""ModelFeed: the one place where verbs fold a live source's events under a lock.

doctor, export, record and demo --no-tui decide when they have seen enough from its
bookkeeping; the end-to-end tests of those verbs run it against real jobs. Here: what
counts as settled, and folding on one thread while another reads.
"""

from __future__ import annotations

import dataclasses
import threading

from ddptop.client.model_feed import ModelFeed
from ddptop.model.job import JobModel
from ddptop.model.outcome import first_failure, resolved_status
from ddptop.protocol import (
    ConnectionEvent,
    Event,
    HistoryMsg,
    RankExit,
    RankState,
    RecordEntry,
    StateMsg,
)
from ddptop.status import Status


def state(rank: int, t: float, step: int, status: str = "running") -> RecordEntry:
    st = RankState(rank=rank, local_rank=rank, world_size=4, host="h", pid=100 + rank, job_id="mf",
                   time=t, step=step, status=status)
    return RecordEntry(time=t, rank=rank, message=StateMsg(state=st))


def history(rank: int, t: float) -> RecordEntry:
    return RecordEntry(time=t, rank=rank, message=HistoryMsg(rank=rank, samples=[]))


def test_settled_counts_states_histories_and_gone_ranks() -> None:
    """A rank is settled once it sent enough states (and its history, when asked), or is
    gone: lost, or its last state was final."""
    feed = ModelFeed("mf", 4)
    ranks = range(4)
    assert feed.settled(ranks) == 0 and not feed.heard_from_any()
    feed.emit(state(0, 10.0, 1))
    feed.emit(state(0, 11.0, 2))
    feed.emit(state(1, 10.0, 1))
    assert feed.heard_from_any()
    assert feed.settled(ranks, states=1) == 2
    assert feed.settled(ranks, states=2) == 1
    assert feed.settled(ranks, history=True) == 0
    feed.emit(history(1, 11.0))
    assert feed.settled(ranks, history=True) == 1  # rank 1: a state and its history
    feed.emit(ConnectionEvent(time=12.0, rank=2, status=Status.LOST, reason="refused"))
    feed.emit(state(3, 12.0, 5, status=Status.EXITED))
    assert feed.settled(ranks, states=2, history=True) == 2  # 2 lost, 3 ended; 0 and 1 not yet
    assert feed.gone == {2, 3}
    assert feed.statuses(13.0)[2] == Status.LOST
    assert feed.model.ranks[3].state is not None and feed.model.ranks[3].state.step == 5


def test_tee_sees_every_event_and_kept_events_stay_in_order() -> None:
    """record writes through *tee*; export keeps the events for its bundle."""
    seen: list[Event] = []
    feed = ModelFeed("mf", 2, keep_events=True, tee=seen.append)
    events: list[Event] = [state(0, 1.0, 1), history(0, 1.5), state(1, 2.0, 1)]
    for e in events:
        feed.emit(e)
    assert seen == events and feed.events == events
    assert ModelFeed("mf", 2).events == []  # nothing kept unless asked


def test_folding_on_one_thread_while_another_reads() -> None:
    """The source's thread folds while the verb's thread reads statuses and copies: no
    torn reads, nothing lost."""
    feed = ModelFeed("mf", 4)
    errors: list[BaseException] = []
    n = 2000

    def source() -> None:
        try:
            for i in range(n):
                feed.emit(state(i % 4, 100.0 + i, i))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=source)
    thread.start()
    reads = 0
    while thread.is_alive() or reads == 0:
        copy = feed.copy()
        assert set(copy.ranks) <= {0, 1, 2, 3}
        feed.statuses(200.0)
        feed.settled(range(4), states=10)
        reads += 1
    thread.join(timeout=30)
    assert not thread.is_alive() and errors == []
    assert sum(feed.states.values()) == n
    assert feed.copy().ranks[3].state is not None
    assert feed.settled(range(4), states=n // 4) == 4


def _mixed_model(now: float) -> JobModel:
    """Ranks in every situation statuses() tells apart."""
    model = JobModel("mf", 8)
    for rank in range(8):
        model.apply(state(rank, now - 1, 10))
    model.apply(state(1, now - 30, 10))  # stale: nothing for 30 s
    model.apply(RankExit(time=now - 3, rank=2, pid=102, signal="SIGSEGV"))  # the first failure
    model.apply(RankExit(time=now - 2, rank=3, pid=103, signal="SIGTERM"))  # torn down after it
    model.apply(state(4, now - 2, 12, status=Status.EXITED))  # said goodbye
    model.apply(ConnectionEvent(time=now - 2, rank=5, status=Status.LOST, reason="closed"))
    model.apply(ConnectionEvent(time=now - 1, rank=9, status="connected"))  # never sent a state
    return model


def test_statuses_match_each_views_own_ending_with_job_context() -> None:
    """statuses() takes a shortcut for ranks that have not ended (thousands per redraw):
    it must say what each view's ending, resolved against the first failure, says."""
    now = 1000.0
    model = _mixed_model(now)
    ends = {r: e for r, v in model.ranks.items() if (e := v.ending()) is not None}
    first = first_failure(ends.values())
    expected = {r: resolved_status(ends[r], first) if r in ends else v.live_status(now)
                for r, v in sorted(model.ranks.items())}
    got = model.statuses(now)
    assert got == expected and list(got) == sorted(got)
    assert [got[r] for r in (0, 1, 2, 3, 4, 5, 9)] == [
        Status.RUNNING, Status.STALE, Status.CRASHED, Status.TORN_DOWN, Status.EXITED, Status.LOST,
        "starting"]


def test_shared_copy_keeps_every_field_and_shares_the_histories() -> None:
    """The dashboard's background diagnosis works on this copy: an exit or a stuck report
    left out would hide a crash or a wedged rank in jobs of 256 ranks and more."""
    model = _mixed_model(1000.0)
    copy = model.shared_copy()
    assert copy.ranks.keys() == model.ranks.keys()
    for rank, view in model.ranks.items():
        twin = copy.ranks[rank]
        assert twin is not view and twin.history is view.history
        for f in dataclasses.fields(view):
            assert getattr(twin, f.name) == getattr(view, f.name), (rank, f.name)
    assert copy.statuses(1000.0) == model.statuses(1000.0)


def test_wait_settled_returns_once_every_rank_settled_and_reports_progress() -> None:
    """A verb waits on the condition, bounded: a feeding thread settles rank after rank."""
    feed = ModelFeed("mf", 3)
    seen: list[int] = []
    release = threading.Event()

    def feed_ranks() -> None:
        for rank in range(3):
            feed.emit(state(rank, 10.0, 1))
        release.wait(30)
    thread = threading.Thread(target=feed_ranks)
    thread.start()
    try:
        assert feed.wait_settled(range(3), 30.0, progress=seen.append) == 3
    finally:
        release.set()
        thread.join(30)
    assert seen[-1] == 3 and seen == sorted(seen)
    # Never settled: the wait ends at its bound with the count it got.
    assert feed.wait_settled(range(3), 0.05, states=2) == 0


def test_live_snapshot_names_every_rank_that_did_not_answer() -> None:
    """snapshot's view of a live job is the model's, each silent, dead or unknown rank listed
    in one line that starts with the rank, and a dead rank's last state still shown."""
    from ddptop.client.collect import GONE
    from ddptop.client.watch import with_silence_named

    feed = ModelFeed("mf", 5)
    feed.emit(state(0, 10.0, 7))
    crashed = RankState(rank=1, local_rank=1, world_size=5, host="h", pid=101, job_id="mf", time=9.0,
                        step=6, status=Status.CRASHED, exit_reason="SIGSEGV")
    feed.emit(RecordEntry(time=10.0, rank=1, message=StateMsg(state=crashed)))
    feed.emit(ConnectionEvent(time=10.0, rank=1, status=Status.LOST, reason=GONE))
    feed.emit(ConnectionEvent(time=10.0, rank=3, status=Status.LOST, reason="no discovery entry"))
    feed.emit(ConnectionEvent(time=10.0, rank=4, status=Status.LOST,
                              reason="connection failed: Connection refused"))
    snap = with_silence_named(feed.model.snapshot(10.5), 2.0)
    assert snap.job.unreachable == {
        1: "rank 1: process 101 is gone (crashed: SIGSEGV)",
        2: "rank 2: no answer within 2 s",
        3: "rank 3: no discovery entry found (not started, or on another host)",
        4: "rank 4: connection failed: Connection refused",
    }
    assert [(s.rank, s.status, s.step) for s in snap.ranks] == [(0, "running", 7), (1, "crashed", 6)]
    assert snap.job.answered == 1
