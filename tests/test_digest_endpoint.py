"""The node agent's digest lane over real sockets: the real NodeEndpoint, raw loopback peers.

A peer that asks "digest" gets the catch-up (the rate rules' window of history), then one
NodeDigest per interval with every pulse and only the changed details, and the rare events
at once. A subscribed peer's stream is the same as ever, a news peer and any peer that never
asked get no NodeDigest (an older viewer would not know the tag), and ``Request.ranks``
narrows state and history to those ranks. Every wait is bounded, on a condition.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Union, get_args

import msgspec
import pytest

from ddptop.agent.digest import CATCHUP_SAMPLES, MAX_EARLIER, WIDE_FROM_RANKS, WIDE_SPAN, DigestBuilder
from ddptop.agent.endpoint import NodeEndpoint
from ddptop.agent.serving import model_catch_up
from ddptop.digest import merged
from ddptop.model.job import JobModel
from ddptop.protocol import (
    DIGEST_FEATURE,
    AgentBeat,
    AgentReply,
    CollectiveGroup,
    Event,
    HistoryMsg,
    Message,
    NodeDigest,
    PendingOp,
    RankExit,
    RankState,
    RecordEntry,
    Request,
    Sample,
    StateMsg,
)
from ddptop.status import Status
from ddptop.wire import LENGTH, encode_frame, header_bytes
from tests.servers import raw_peer, read_hello
from tests.stand_in_agent import StandInAgent

JOB = "dg"
RANKS = (0, 1, 2, 3)
TICK_S = 0.2  # the digest interval here: short, so that several arrive in a second
# What a peer of before the digest can decode: the wire vocabulary without the new tag.
OLD_TYPES = tuple(t for t in get_args(Message) if t is not NodeDigest)
OLD_DECODER: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(Union[OLD_TYPES])  # noqa: UP007


def state(rank: int, t: float, step: int, waiting: bool = False, since: float | None = None) -> RankState:
    began = t - 3 if since is None else since
    pending = [PendingOp(seq=8, op="nccl:all_reduce", started_at=began, age_s=t - began)] if waiting else []
    group = CollectiveGroup(pg="0", seq=7 + step, pending=pending, enqueue_times=[(8 * step, t)])
    return RankState(rank=rank, local_rank=rank, world_size=4, host="node-a", pid=1000 + rank, job_id=JOB,
                     time=t, step=step, status=Status.RUNNING, collectives=[group])


def entry(rank: int, t: float, step: int, waiting: bool = False, since: float | None = None) -> RecordEntry:
    return RecordEntry(time=t, rank=rank, message=StateMsg(state=state(rank, t, step, waiting, since)))


def ring(rank: int, t: float, n: int) -> list[Sample]:
    return [Sample.of(state(rank, t - n + i, i), t - n + i) for i in range(n)]


def catch_up() -> list[Event]:
    t = time.time()
    out: list[Event] = []
    for r in RANKS:
        out.append(RecordEntry(time=t, rank=r, message=HistoryMsg(rank=r, samples=ring(r, t, 100))))
        out.append(RecordEntry(time=t, rank=r, message=StateMsg(state=state(r, t, 1))))
    return out


@contextmanager
def serving(answers: Callable[[], list[Event]]) -> Iterator[NodeEndpoint]:
    """A real NodeEndpoint whose agent's catch-up is *answers()*, closed after."""
    node = NodeEndpoint("127.0.0.1", 0, None, JOB, StandInAgent(answers), host="node-a",
                        digest_s=TICK_S)
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def endpoint() -> Iterator[NodeEndpoint]:
    with serving(catch_up) as node:
        yield node


@pytest.fixture
def endpoint_wide() -> Iterator[NodeEndpoint]:
    """The endpoint of a node of a job of WIDE_FROM_RANKS ranks (four of them here)."""
    def wide_catch_up() -> list[Event]:
        return [wide(e) if isinstance(e, RecordEntry) and isinstance(e.message, StateMsg) else e
                for e in catch_up()]
    with serving(wide_catch_up) as node:
        yield node


class Peer:
    """A raw loopback peer: the frames as they come, decoded as an older peer would."""

    def __init__(self, port: int, *commands: str) -> None:
        self.sock = raw_peer(port)
        self.hello, _ = read_hello(self.sock)
        self.sock.sendall(header_bytes())
        self.raw = bytearray()
        self.messages: list[Any] = []
        self.frames: list[bytes] = []
        self.asked = len(commands)
        for i, command in enumerate(commands, 1):
            self.send(Request(command=command, id=i))

    def caught_up(self, old: bool = True) -> None:
        """Wait for the answer to every command sent at connection."""
        self.until(lambda ms: sum(isinstance(m, AgentReply) for m in ms) >= self.asked, "the replies",
                   old=old)

    def send(self, request: Request) -> None:
        self.sock.sendall(encode_frame(request))

    def until(self, predicate: Callable[[list[Any]], bool], what: str, timeout: float = 10.0,
              old: bool = False) -> list[Any]:
        """Read until *predicate* holds over every message so far (bounded)."""
        deadline = time.monotonic() + timeout
        while not predicate(self.messages):
            left = deadline - time.monotonic()
            assert left > 0, f"no {what} within {timeout} s: {self.messages!r:.400}"
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            assert data, f"closed before {what}"
            self.raw += data
            self._parse(old)
        return self.messages

    def _parse(self, old: bool) -> None:
        while len(self.raw) >= LENGTH.size:
            (n,) = LENGTH.unpack_from(self.raw)
            if len(self.raw) < LENGTH.size + n:
                return
            body = bytes(self.raw[LENGTH.size:LENGTH.size + n])
            del self.raw[:LENGTH.size + n]
            self.frames.append(body)
            decoded = OLD_DECODER.decode(body) if old else msgspec.msgpack.decode(body, type=Message)
            self.messages.append(decoded)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()


def digests(msgs: list[Any]) -> list[NodeDigest]:
    return [m for m in msgs if isinstance(m, NodeDigest)]


def test_a_digest_peer_gets_the_catch_up_then_one_digest_per_interval(endpoint: NodeEndpoint) -> None:
    with Peer(endpoint.port, "digest") as peer:
        assert DIGEST_FEATURE in peer.hello.features
        reply = peer.until(lambda ms: any(isinstance(m, AgentReply) for m in ms), "catch-up")[0]
        assert isinstance(reply, AgentReply) and reply.id == 1
        histories = [e.message for e in reply.entries if isinstance(e, RecordEntry)
                     and isinstance(e.message, HistoryMsg)]
        assert sorted(h.rank for h in histories) == list(RANKS)
        assert all(len(h.samples) == CATCHUP_SAMPLES for h in histories)  # the window, not 100
        base = {e.rank: e.message.state for e in reply.entries
                if isinstance(e, RecordEntry) and isinstance(e.message, StateMsg)}
        t = time.time()
        for r in RANKS:  # every rank moves; only rank 2 enters a collective
            endpoint.publish(entry(r, t, 2, waiting=r == 2))
        got = peer.until(lambda ms: sum(len(d.pulses) for d in digests(ms)) >= 4, "the pulses")
        carried = [d for d in digests(got) if d.pulses]
        assert [s.rank for d in carried for s in d.details] == [2]  # the one changed detail
        for d in carried:
            for p in d.pulses:
                after = merged(base[p.rank] if p.rank != 2 else d.details[0], p)
                assert after == state(p.rank, t, 2, waiting=p.rank == 2)
        # The interval: numbered without a gap, about TICK_S apart, whether or not a rank spoke.
        got = peer.until(lambda ms: len(digests(ms)) >= 6, "six digests")
        nos = [d.no for d in digests(got)]
        assert nos == list(range(nos[0], nos[0] + len(nos)))
        gaps = [b.time - a.time for a, b in zip(digests(got), digests(got)[1:], strict=False)]
        assert min(gaps) > TICK_S / 2, gaps
        assert digests(got)[-1].summary.ranks == list(RANKS)
        # A rare event goes at once, as today's event.
        exit_ = RankExit(time=time.time(), rank=3, pid=1003, host="node-a", signal="SIGKILL")
        endpoint.publish(exit_)
        assert exit_ in peer.until(lambda ms: exit_ in ms, "the exit")


def test_subscribers_news_peers_and_old_peers_never_see_a_digest(endpoint: NodeEndpoint) -> None:
    with Peer(endpoint.port, "history", "subscribe") as sub, Peer(endpoint.port, "news") as news, \
            Peer(endpoint.port, "digest") as lane:
        for p in (sub, news, lane):
            p.caught_up(old=p is not lane)
        sub_before = len(sub.frames)
        t = time.time()
        sent: list[Event] = [entry(r, t, 5) for r in RANKS]
        sent.append(RankExit(time=t, rank=1, pid=1001, host="node-a", exit_code=0))
        for event in sent:
            endpoint.publish(event)
        lane.until(lambda ms: len(digests(ms)) >= 3, "three digests")
        beat = AgentBeat(time=t, host="node-a", ranks=list(RANKS))
        endpoint.publish(beat, news=True)  # after the digests: news and subscribers are past them
        news.until(lambda ms: beat in ms, "the beat", old=True)
        sub.until(lambda ms: sent[-1] in ms, "the exit", old=True)
        # The subscriber's stream, byte for byte: the events as published, nothing else.
        assert sub.frames[sub_before:] == [encode_frame(e)[LENGTH.size:] for e in sent]
        assert not digests(news.messages) and not digests(sub.messages)


def test_request_ranks_narrows_state_and_history(endpoint: NodeEndpoint) -> None:
    with Peer(endpoint.port) as peer:
        peer.send(Request(command="state", id=7, ranks=[2]))
        peer.send(Request(command="history", id=8))
        replies = peer.until(lambda ms: len(ms) >= 2, "two replies", old=True)
        narrow, whole = (r for r in replies if isinstance(r, AgentReply))
        assert narrow.id == 7 and {e.rank for e in narrow.entries} == {2}
        assert whole.id == 8 and {e.rank for e in whole.entries} == set(RANKS)  # as ever
        # Still 100 samples: only "digest" cuts the history to the rules' window.
        assert all(len(e.message.samples) == 100 for e in narrow.entries
                   if isinstance(e, RecordEntry) and isinstance(e.message, HistoryMsg))


def test_the_agent_model_answers_some_ranks_and_the_window() -> None:
    model = JobModel(job_id=JOB)
    t = time.time()
    for r in RANKS:
        model.apply(RecordEntry(time=t, rank=r, message=HistoryMsg(rank=r, samples=ring(r, t, 90))))
        model.apply(RecordEntry(time=t, rank=r, message=StateMsg(state=state(r, t, 1))))
    some = model_catch_up(model, {1, 3}, t, samples=CATCHUP_SAMPLES)
    assert {e.rank for e in some} == {1, 3}
    cut = [e.message for e in some if isinstance(e, RecordEntry) and isinstance(e.message, HistoryMsg)]
    assert [len(h.samples) for h in cut] == [CATCHUP_SAMPLES] * 2
    assert cut[0].samples[-1] == model.ranks[1].history[-1]  # the newest kept
    assert len(model_catch_up(model, set(RANKS), t)) == 8  # today's call, unchanged


def test_the_builder_sends_a_detail_only_when_its_key_moves() -> None:
    builder = DigestBuilder("node-a", silent_s=3.0)
    t = 1000.0
    builder.seed([RecordEntry(time=t, rank=0, message=StateMsg(state=state(0, t, 1)))])
    for step in (2, 3):
        assert not builder.add(entry(0, t + step, step))
    first = builder.flush(t + 3.5)
    # One pulse: the newest state's, with the sample before it and both steps' milestones
    # (the rank keeps one, so the viewer's copy keeps the newest).
    assert first.details == [] and [p.sample.step for p in first.pulses] == [3]
    assert [s.step for s in first.pulses[0].earlier] == [2] and first.pulses[0].enqueued == [(24, t + 3)]
    assert [round(p.heard_ago, 3) for p in first.pulses] == [0.5]
    assert not builder.add(entry(0, t + 4, 4, waiting=True))
    second = builder.flush(t + 9)
    assert [s.step for s in second.details] == [4] and second.detail_nos == [1]
    assert second.summary.silent == [0] and second.no == first.no + 1  # not heard for 5 s
    last_words = msgspec.structs.replace(state(0, t + 9, 4), status="exited")
    final = RecordEntry(time=t + 9, rank=0, message=StateMsg(state=last_words))
    assert builder.add(final)  # last words: at once, whole
    assert builder.flush(t + 30).summary.silent == []  # ended, not silent



def wide(e: RecordEntry, world_size: int = WIDE_FROM_RANKS) -> RecordEntry:
    assert isinstance(e.message, StateMsg)
    return msgspec.structs.replace(e, message=StateMsg(
        state=msgspec.structs.replace(e.message.state, world_size=world_size)))


def test_a_wide_jobs_digest_spans_two_intervals_one_pulse_a_rank_and_detail() -> None:
    builder = DigestBuilder("node-a", silent_s=3.0)
    t = 1000.0
    short = DigestBuilder("node-a")
    short.seed([wide(entry(0, t, 1), WIDE_FROM_RANKS - 1)])
    assert short.span == 1  # one rank short of wide
    builder.seed([wide(entry(r, t, 1)) for r in RANKS])
    assert builder.span == WIDE_SPAN == 2
    builder.add(wide(entry(0, t + 1, 2)))
    for r in RANKS:
        builder.add(wide(entry(r, t + 2, 3, waiting=r == 2, since=t + 1.5)))  # one op, waited for longer
        builder.add(wide(entry(r, t + 3, 4, waiting=r == 2, since=t + 1.5)))
    d = builder.flush(t + 3.5)
    by_rank = {r: [p for p in d.pulses if p.rank == r] for r in RANKS}
    # Rank 0: steps 2, 3 and 4 in one pulse; ranks 1 and 3: 3 and 4; rank 2 entered a
    # collective at step 3: its step 2 lay on another detail (it has none here: seeded at 1).
    assert [(p.sample.step, [s.step for s in p.earlier]) for p in by_rank[0]] == [(4, [2, 3])]
    assert [(p.sample.step, [s.step for s in p.earlier]) for p in by_rank[1]] == [(4, [3])]
    assert [(p.sample.step, [s.step for s in p.earlier], p.detail_no) for p in by_rank[2]] == [(4, [3], 1)]
    assert [s.step for s in d.details] == [3] and d.detail_nos == [1]
    # The pulses keep the order the ranks were first heard in, and the digest after starts afresh.
    assert [p.rank for p in d.pulses] == [0, 1, 2, 3]
    builder.add(wide(entry(1, t + 4, 5)))
    assert [(p.rank, p.earlier) for p in builder.flush(t + 4.5).pulses] == [(1, [])]


def test_a_stalled_lane_keeps_the_newest_samples_a_pulse_may_carry() -> None:
    builder = DigestBuilder("node-a", silent_s=3.0)
    t = 1000.0
    builder.seed([entry(0, t, 1)])
    for step in range(2, MAX_EARLIER + 10):
        builder.add(entry(0, t + step / 100, step))
    d = builder.flush(t + 1)
    (pulse,) = d.pulses
    assert len(pulse.earlier) == MAX_EARLIER and pulse.earlier[-1].step == pulse.sample.step - 1
    # Within the protocol's bounds: a viewer decodes it.
    assert msgspec.msgpack.decode(encode_frame(d)[LENGTH.size:], type=Message) == d


def test_a_wide_job_gets_a_digest_every_two_intervals_and_every_sample(endpoint_wide: NodeEndpoint) -> None:
    with Peer(endpoint_wide.port, "digest") as peer:
        peer.caught_up(old=False)
        t = time.time()
        for step in range(2, 8):
            for r in RANKS:
                endpoint_wide.publish(wide(entry(r, t + step, step)))
            if step % 2:  # some samples now and then, as ranks send them
                seen = len(digests(peer.messages))
                peer.until(lambda ms, seen=seen: len(digests(ms)) > seen, "a digest")
        got = peer.until(lambda ms: all(
            7 in {p.sample.step for d in digests(ms) for p in d.pulses if p.rank == r} for r in RANKS),
            "every rank's last sample")
        for r in RANKS:  # every sample once, in order, as a pulse or carried by one
            steps = [s.step for d in digests(got) for p in d.pulses if p.rank == r
                     for s in (*p.earlier, p.sample)]
            assert steps == list(range(2, 8)), (r, steps)
        got = digests(peer.until(lambda ms: len(digests(ms)) >= 6, "six digests"))
        # Each digest is due two intervals after the one before, or at once when the loop fell
        # further behind than that: from the first to the last, at least all but one spans
        # went by, however late any came (one interval apart, 5 digests would take 1 s).
        assert got[-1].time - got[0].time >= (len(got) - 2) * 2 * TICK_S - 0.01, [d.time for d in got]
