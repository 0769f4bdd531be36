"""The viewer's side of the digest lane (ddptop.client.digest_view), fed by the agent's real
DigestBuilder and through real frames: every sample comes back as the state the rank sent, on
every field a rule or a column reads; a lost digest or detail is repaired, never guessed over.
"""

from __future__ import annotations

from msgspec.structs import replace

from ddptop import digest
from ddptop.agent.digest import DigestBuilder
from ddptop.client.digest_view import DigestView
from ddptop.digest import PulseBatch
from ddptop.model.job import JobModel
from ddptop.protocol import (
    CollectiveGroup,
    Event,
    GpuInfo,
    NodeDigest,
    PendingOp,
    RankState,
    RecordEntry,
    Sample,
    StateMsg,
)
from ddptop.wire import FrameBuffer, encode_frame, header_bytes

NOW = 1_700_000_000.0
RANKS = range(4)


def state(rank: int, tick: int) -> RankState:
    """Rank *rank* at sample *tick*: steps and seqs move every sample; from tick 5 rank 2 waits
    in all_reduce #seq+1 (a collective entered: a detail change), at tick 8 it is back."""
    waiting = rank == 2 and 5 <= tick < 8
    seq = 15 if waiting else 3 * tick  # a waiting rank's seq stands still
    pending = [PendingOp(seq=seq + 1, op="gloo:all_reduce", age_s=0.5 * (tick - 4), started_at=NOW + 5,
                         sizes=[[[1000]]], dtype="Float")] if waiting else []
    milestones = [(s, NOW + s / 3) for s in range(0, seq + 1, 8)][-6:]
    group = CollectiveGroup(pg="0", seq=seq, size=4, backend="gloo", seq_changed_at=NOW + tick,
                            pending=pending, enqueue_times=milestones)
    return RankState(rank=rank, local_rank=rank, world_size=4, host="node-a", pid=100 + rank, job_id="j",
                     time=NOW + tick, step=tick * 2, step_time_s=0.5, last_step_at=NOW + tick, epoch=0,
                     batch=tick, batches_per_epoch=100, collectives=[group], cpu_percent=50.0 + tick,
                     rss_bytes=1 << 30, load_avg=[1.0 + tick, 2.0, 3.0], shm_used_bytes=tick << 20,
                     shm_total_bytes=1 << 30, env={"X": "1"},
                     gpu=GpuInfo(index=rank, name="H100", util_percent=float(tick), mem_used_bytes=tick << 20,
                                 mem_total_bytes=1 << 36))


def entry(s: RankState) -> RecordEntry:
    return RecordEntry(time=s.time, rank=s.rank, message=StateMsg(state=s))


def over_the_wire(d: NodeDigest) -> NodeDigest:
    """The digest as a viewer decodes it: encoded, framed and parsed, like on a socket."""
    got = FrameBuffer().feed(header_bytes() + encode_frame(d))
    assert len(got) == 1 and isinstance(got[0], NodeDigest)
    return got[0]


def same(a: RankState, b: RankState) -> bool:
    """Equal on every pulse and detail field (on-demand ones may be older)."""
    return digest.detail_key(a) == digest.detail_key(b) and \
        digest.pulse_of(a, 0.0) == digest.pulse_of(b, 0.0)


def entries_of(events: list[Event | PulseBatch]) -> list[Event]:
    """*events* with each pulse batch as the whole states its pulses stand for."""
    return [e for x in events for e in (x.entries() if isinstance(x, PulseBatch) else [x])]


def states_of(events: list[Event | PulseBatch]) -> list[RankState]:
    return [e.message.state for e in entries_of(events)
            if isinstance(e, RecordEntry) and isinstance(e.message, StateMsg)]


def test_every_sample_comes_back_as_the_rank_sent_it() -> None:
    """Two samples a digest: each rank's newest state comes back exact (as a pulse over its
    detail), the one before it as a history point, and a rank whose detail changed in between
    has a pulse for each detail, so no detail is skipped."""
    builder, view, model = DigestBuilder("node-a"), DigestView(), JobModel()
    catch_up = [entry(state(r, 0)) for r in RANKS]
    builder.seed(list(catch_up))
    for e in catch_up:
        view.whole(e)
        model.apply(e)
    sent: list[RankState] = []
    got: list[RankState] = []
    details = pulses = 0
    for tick in range(1, 11):
        for r in RANKS:
            s = state(r, tick)
            sent.append(s)
            assert builder.add(entry(s)) is False  # a running state: the lane carries it
        if tick % 2 == 0:
            d = over_the_wire(builder.flush(NOW + tick + 0.25))
            details += len(d.details)
            pulses += len(d.pulses)
            events, repair = view.expand(d, shift=0.0)
            assert repair == []
            got.extend(states_of(events))
            for event in events:
                model.apply(event)
    assert view.skipped == 0
    # What the pulses stand for: the newest state of each rank and detail, exact.
    by_key = {(s.rank, s.time): s for s in sent}
    for s in got:
        assert same(s, by_key[(s.rank, s.time)]), (s.rank, s.time)
    assert {(s.rank, s.time - NOW) for s in got if s.rank != 2} == \
        {(r, t) for r in (0, 1, 3) for t in (2, 4, 6, 8, 10)}
    # Rank 2 entered its collective at tick 5 and left at 8: ticks 7 and 8 lie on two details.
    assert sorted(s.time - NOW for s in got if s.rank == 2) == [2, 4, 6, 7, 8, 10]
    assert details == 2 and pulses == 4 * 5 + 1
    # Every sample, none twice, in the order sent: the viewer's history is the rank's.
    for r in RANKS:
        want = [Sample.of(s, s.time) for s in [state(r, 0), *sent] if s.rank == r]
        assert list(model.ranks[r].history) == want, r


def test_a_lost_digest_is_repaired_with_fresh_states_never_guessed_over() -> None:
    builder, view = DigestBuilder("node-a"), DigestView()
    for r in RANKS:
        builder.seed([entry(state(r, 0))])
        view.whole(entry(state(r, 0)))
    for tick in (1, 2, 3, 4, 5):
        for r in RANKS:
            builder.add(entry(state(r, tick)))
        d = over_the_wire(builder.flush(NOW + tick + 0.25))
        if tick == 5:
            lost = d  # rank 2 entered its collective in this one: its detail is lost with it
            continue
        view.expand(d, shift=0.0)
    assert 2 in {s.rank for s in lost.details}
    for r in RANKS:
        builder.add(entry(state(r, 6)))
    events, repair = view.expand(over_the_wire(builder.flush(NOW + 6.25)), shift=0.0)
    # The gap in the digests' numbers: every rank is asked again, none is shown from a stale copy.
    assert repair == list(RANKS) and states_of(events) == [] and view.skipped == 4
    for r in RANKS:  # the agent's answer to Request("state", ranks=...): whole states
        view.whole(entry(state(r, 6)))
    for r in RANKS:
        builder.add(entry(state(r, 7)))
    events, repair = view.expand(over_the_wire(builder.flush(NOW + 7.25)), shift=0.0)
    assert repair == [] and [s.rank for s in states_of(events)] == list(RANKS)
    for s in states_of(events):
        assert same(s, state(s.rank, 7))


def test_times_move_onto_the_viewers_clock_and_a_rank_it_never_had_is_asked_for() -> None:
    builder, view = DigestBuilder("node-a"), DigestView()
    builder.seed([entry(state(0, 0))])
    view.whole(entry(state(0, 0)))
    builder.add(entry(state(0, 1)))
    builder.add(entry(replace(state(1, 1), env={})))  # a rank the viewer has no copy of
    d = over_the_wire(builder.flush(NOW + 1.5))
    events, repair = view.expand(d, shift=10.0)
    # Rank 1's first state is a detail (the agent never told anyone of it): shown at once.
    assert [(e.rank, round(e.time - NOW, 3)) for e in entries_of(events)] == [(0, 11.0), (1, 11.0)]
    assert repair == []
    view.copies.pop(1)
    builder.add(entry(state(1, 2)))
    events, repair = view.expand(over_the_wire(builder.flush(NOW + 2.5)), shift=10.0)
    assert events == [] and repair == [1]  # only pulses for it, and no copy here: asked again


# ------------------------------------------------------------------ over real sockets


def test_a_digest_viewer_sees_what_a_subscribed_viewer_sees() -> None:
    """The real NodeEndpoint, two real LiveSources on loopback: one asks for the digest lane,
    one subscribes. Once both saw the last sample, their models agree on every pulse and
    detail field of every rank, and the digest viewer got NodeDigests, not a frame per state."""
    import threading
    import time as clock

    from ddptop.agent.endpoint import NodeEndpoint
    from ddptop.client.live import LiveSource
    from ddptop.client.model_feed import ModelFeed
    from ddptop.client.targets import JobTarget
    from ddptop.store.discovery import Endpoint
    from tests.stand_in_agent import StandInAgent

    lock = threading.Lock()
    current: dict[int, RankState] = {r: state(r, 0) for r in RANKS}

    def catch_up() -> list[Event]:
        with lock:
            return [entry(s) for s in current.values()]

    node = NodeEndpoint("127.0.0.1", 0, None, "j", StandInAgent(catch_up), host="node-a",
                        digest_s=0.1)

    def steps_at(feed: ModelFeed, step: int, timeout: float = 5.0) -> None:
        """Wait (bounded) until every rank's state in *feed* is at *step*."""
        deadline = clock.monotonic() + timeout
        while clock.monotonic() < deadline:
            model = feed.copy()
            if all((v := model.ranks.get(r)) is not None and v.state is not None and v.state.step == step
                   for r in RANKS):
                return
            clock.sleep(0.05)
    feeds = {"digest": ModelFeed("j", 4), "subscribe": ModelFeed("j", 4)}
    sources = []
    try:
        endpoints = [Endpoint(job_id="j", rank=r, world_size=4, host="127.0.0.1", port=1, pid=100 + r,
                              agent_port=node.port) for r in RANKS]
        for mode, feed in feeds.items():
            source = LiveSource(JobTarget(job_id="j", world_size=4, endpoints=endpoints, via_agents=True),
                                read_remains=False, read_stuck=False, digest=mode == "digest")
            source.start(feed.emit)
            sources.append(source)
        for feed in feeds.values():  # both caught up: every rank's state at tick 0
            assert feed.wait_settled(RANKS, 30.0) == 4
        last = 10
        for tick in range(1, last + 1):
            for r in RANKS:
                s = replace(state(r, tick), time=clock.time())
                with lock:
                    current[r] = s
                node.publish(entry(s))
            if tick % 3 == 0:  # let a digest or two go out between bursts, as samples do
                steps_at(feeds["digest"], 2 * tick)

        for feed in feeds.values():
            steps_at(feed, 2 * last, timeout=30.0)
        models = {mode: feed.copy() for mode, feed in feeds.items()}
        for r in RANKS:
            a, b = models["digest"].ranks[r].state, models["subscribe"].ranks[r].state
            assert a is not None and b is not None and a.step == 2 * last and same(a, b), r
            # Every sample, whether its pulse came or only the sample (two in one digest).
            assert list(models["digest"].ranks[r].history) == list(models["subscribe"].ranks[r].history), r
            assert len(models["digest"].ranks[r].history) == 1 + last
        assert sources[0]._agent_peers[0].digest is not None
        assert sources[0]._agent_peers[0].digest.pulses > 0
        assert sources[1]._agent_peers[0].digest is None
    finally:
        for source in sources:
            source.stop()
        node.close()
