"""The node agent's one endpoint, and a viewer that reaches ranks through it.

Real sockets on loopback, the real :class:`NodeEndpoint` and :class:`LiveSource`: what the
agent knows about its ranks is handed in as the events it would have got from them. One
connection carries every rank; a viewer that connects late gets the catch-up with ages
kept; requests are asked once per node; a wrong token is refused and said so; the agent's
loss is the loss of all its ranks, named. Every wait is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddptop.agent.endpoint import NodeEndpoint
from ddptop.client.live import LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import JobTarget
from ddptop.protocol import (
    ErrorMsg,
    Event,
    FrameStack,
    HistoryMsg,
    RankExit,
    RankState,
    RecordEntry,
    Sample,
    StacksMsg,
    StateMsg,
    ThreadStack,
)
from ddptop.status import Status
from ddptop.store.discovery import Endpoint
from tests.jobs import wait_until
from tests.stand_in_agent import StandInAgent

TOKEN = "endpoint-test-token"
JOB = "ep"
RANKS = (0, 1, 2, 3)


def state(rank: int, t: float, step: int) -> RankState:
    return RankState(rank=rank, local_rank=rank, world_size=4, host="node-a", pid=1000 + rank, job_id=JOB,
                     time=t, step=step, status=Status.RUNNING)


class FakeRanks(StandInAgent):
    """What the agent knows of its four ranks (the agent's own bookkeeping, in the real one)."""

    def __init__(self, age_s: float, clock_ahead_s: float = 0.0) -> None:
        super().__init__()
        self.age_s = age_s
        self.clock_ahead_s = clock_ahead_s
        self.asked: list[str] = []

    def now(self) -> float:
        """The agent host's wall clock."""
        return time.time() + self.clock_ahead_s

    def events(self) -> list[Event]:
        t = self.now() - self.age_s
        out: list[Event] = []
        for r in RANKS:
            samples = [Sample(time=t - 2 + i, step=i, epoch=0, batch=i, seq=i, step_time_s=0.1,
                              data_wait_fraction=None, loader_ready_batches=None, cpu_percent=None,
                              rss_bytes=None, gpu_util_percent=None) for i in range(2)]
            out.append(RecordEntry(time=t, rank=r, message=HistoryMsg(rank=r, samples=samples)))
            out.append(RecordEntry(time=t, rank=r, message=StateMsg(state=state(r, t, 10 + r))))
        return out

    def ask(self, command: str, timeout: float) -> list[Event]:
        self.asked.append(command)
        now = time.time()
        frames = [FrameStack(file="train.py", line=88, function="step")]
        main = ThreadStack(thread_id=1, name="MainThread", frames=frames, is_main=True)
        out: list[Event] = [RecordEntry(time=now, rank=r, message=StacksMsg(rank=r, time=now, threads=[main]))
                            for r in RANKS[:3]]
        out.append(RecordEntry(time=now, rank=3, message=ErrorMsg(reason="no answer within 4 s")))
        return out


@pytest.fixture
def node(runtime_dir: Path) -> Iterator[tuple[NodeEndpoint, FakeRanks]]:
    ranks = FakeRanks(age_s=0.0)
    endpoint = NodeEndpoint("127.0.0.1", 0, TOKEN, JOB, ranks)
    try:
        yield endpoint, ranks
    finally:
        endpoint.close()


def viewer(port: int, token: str) -> tuple[LiveSource, ModelFeed]:
    endpoints = [Endpoint(job_id=JOB, rank=r, world_size=4, host="127.0.0.1", port=1, pid=1000 + r,
                          node="node-a", agent_port=port) for r in RANKS]
    target = JobTarget(job_id=JOB, world_size=4, endpoints=endpoints, via_agents=True)
    source = LiveSource(target, token=token)
    feed = ModelFeed(JOB, 4)
    source.start(feed.emit)
    return source, feed


def test_one_connection_carries_every_rank_and_its_requests(node: tuple[NodeEndpoint, FakeRanks]) -> None:
    endpoint, ranks = node
    source, feed = viewer(endpoint.port, TOKEN)
    try:
        wait_until(lambda: feed.settled(RANKS, history=True) == 4, 10.0, "every rank's history and state")
        assert endpoint.server.client_count == 1  # one viewer, one connection, four ranks
        with feed.lock:
            steps = {r: v.state.step for r, v in feed.model.ranks.items() if v.state}
            assert steps == {0: 10, 1: 11, 2: 12, 3: 13}
            assert all(len(v.history) >= 2 for v in feed.model.ranks.values())
        # What happens after the catch-up streams in: a new state, an exit.
        now = time.time()
        endpoint.publish(RecordEntry(time=now, rank=2, message=StateMsg(state=state(2, now, 99))))
        endpoint.publish(RankExit(time=now, rank=3, pid=1003, host="node-a", signal="SIGKILL"))
        wait_until(lambda: 3 in feed.gone, 10.0, "rank 3's exit")
        with feed.lock:
            view2, view3 = feed.model.ranks[2], feed.model.ranks[3]
            assert view2.state is not None and view2.state.step == 99
            assert view3.exit is not None and view3.exit.signal == "SIGKILL"
        # Stacks: one request to the node, each rank's part back (or why not).
        result = source.request_stacks(timeout=5.0)
        assert ranks.asked == ["stacks"]
        assert sorted(result.stacks) == [0, 1, 2]
        assert all(s.threads[0].frames[0].line == 88 for s in result.stacks.values())
        assert result.errors == {3: "no answer within 4 s"}
        # The agent goes away: every rank it served is lost, and the reason names it.
        endpoint.close()
        wait_until(lambda: feed.gone == set(RANKS), 10.0, "every served rank lost")
        with feed.lock:
            reasons = {r: feed.model.ranks[r].connection_reason for r in (0, 1, 2)}
        where = f"node agent at 127.0.0.1:{endpoint.port}"
        assert all(why.startswith(where) for why in reasons.values()), reasons
    finally:
        source.stop()


def test_catch_up_keeps_the_age_of_what_the_agent_knows(runtime_dir: Path) -> None:
    """A rank the agent last heard from 30 s ago is stale to a viewer that connects now,
    whatever the two clocks say (the agent's runs an hour ahead here): entry times move by
    the viewer's clock minus the agent's."""
    ranks = FakeRanks(age_s=30.0, clock_ahead_s=3600.0)
    endpoint = NodeEndpoint("127.0.0.1", 0, TOKEN, JOB, ranks)
    source, feed = viewer(endpoint.port, TOKEN)
    try:
        wait_until(lambda: feed.settled(RANKS) == 4, 10.0, "the catch-up")
        now = time.time()
        with feed.lock:
            ages = [now - v.received_at for v in feed.model.ranks.values()]
            statuses = feed.model.statuses(now)
        assert all(29.0 < age < 40.0 for age in ages), ages
        assert set(statuses.values()) == {Status.STALE}, statuses
    finally:
        source.stop()
        endpoint.close()


def test_a_wrong_token_is_refused_and_said_so(node: tuple[NodeEndpoint, FakeRanks]) -> None:
    endpoint, _ = node
    source, feed = viewer(endpoint.port, "not-the-token")
    try:
        wait_until(lambda: feed.gone == set(RANKS), 10.0, "every rank given up")
        with feed.lock:
            assert not feed.states  # nothing was served
            reasons = {feed.model.ranks[r].connection_reason for r in RANKS}
        assert len(reasons) == 1, reasons
        assert f"node agent at 127.0.0.1:{endpoint.port} refused the token" in reasons.pop()
        wait_until(lambda: endpoint.server.counters.rejected_peers == 1, 10.0,
                   "the refusal counted by the agent")
    finally:
        source.stop()
