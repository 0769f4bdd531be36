"""``request_states``: a live source asks for ranks' fresh whole states (issue #23).

Real sockets on loopback: ranks reached directly (a synthetic job's rank servers) answer on
their own connection; ranks behind the real :class:`NodeEndpoint` are asked once per agent
for the wanted ranks only, each rank's state picked out of the answer, its time on the
viewer's clock. A rank that cannot be asked is an error with why. Every wait is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddptop.agent.endpoint import NodeEndpoint
from ddptop.bundle.replay_source import ReplaySource
from ddptop.client.live import LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import JobTarget, resolve
from ddptop.protocol import Event, RankState, RecordEntry, StacksMsg, StateMsg, StuckReport
from ddptop.status import Status
from ddptop.store.discovery import Endpoint
from ddptop.testing.synthetic import SyntheticJob
from tests.jobs import wait_until
from tests.stand_in_agent import StandInAgent

JOB, RANKS, AHEAD_S, AGE_S = "rs", (0, 1, 2, 3), 100.0, 2.0


class Node(StandInAgent):
    """What a node agent knows of its four ranks; rank 2 is stuck (a report after its state)."""

    def __init__(self) -> None:
        super().__init__()
        self.selected: list[set[int] | None] = []  # the ranks of each request that named some

    def catch_up(self, ranks: set[int] | None, samples: int | None) -> list[Event]:
        """The agent's cut of its catch-up for a request (what it would send)."""
        if ranks is not None:
            self.selected.append(ranks)
        return super().catch_up(ranks, samples)

    def now(self) -> float:
        """The agent host's wall clock, well ahead of the viewer's."""
        return time.time() + AHEAD_S

    def events(self) -> list[Event]:
        t = self.now() - AGE_S
        out: list[Event] = []
        for r in RANKS:
            st = RankState(rank=r, local_rank=r, world_size=4, host="node-a", pid=1000 + r, job_id=JOB,
                           time=t, step=10 + r, status=Status.RUNNING, threads=20 + r)
            out.append(RecordEntry(time=t, rank=r, message=StateMsg(state=st)))
        stuck = StuckReport(rank=2, pid=1002, time=t, since=t - 1.0, source="py-spy")
        out.append(RecordEntry(time=t, rank=2, message=StacksMsg.of_stuck(stuck)))
        return out

    def ask(self, command: str, timeout: float) -> list[Event]:
        return []


@pytest.fixture
def node(runtime_dir: Path) -> Iterator[tuple[NodeEndpoint, Node]]:
    ranks = Node()
    endpoint = NodeEndpoint("127.0.0.1", 0, None, JOB, ranks)
    try:
        yield endpoint, ranks
    finally:
        endpoint.close()


def test_states_through_a_node_agent(node: tuple[NodeEndpoint, Node]) -> None:
    endpoint, ranks = node
    endpoints = [Endpoint(job_id=JOB, rank=r, world_size=4, host="127.0.0.1", port=1, pid=1000 + r,
                          node="node-a", agent_port=endpoint.port) for r in RANKS]
    source = LiveSource(JobTarget(job_id=JOB, world_size=4, endpoints=endpoints, via_agents=True))
    feed = ModelFeed(JOB, 4)
    source.start(feed.emit)
    try:
        wait_until(lambda: feed.settled(RANKS) == 4, 10.0, "every rank's state through the agent")
        assert not source.on_demand_stale(2)  # subscribed, not the digest lane: states are whole
        asked_at = time.time()
        result = source.request_states([2, 9], timeout=5.0)
        # The stuck rank's state, not the report beside it; a rank nobody serves: why.
        assert sorted(result.states) == [2] and result.states[2].threads == 22
        assert result.errors == {9: "not connected"}
        assert ranks.selected == [{2}]  # one state asked of the agent, not its whole node's
        # When the agent heard it, on this viewer's clock (the agent's runs AHEAD_S ahead).
        assert asked_at - AGE_S - 1.0 <= result.taken_at[2] <= time.time()
        endpoint.close()
        wait_until(lambda: all(p.sock is None for p in source._agent_peers), 10.0, "the agent gone")
        failed = source.request_states([1], timeout=5.0)
        assert not failed.states and failed.errors == {1: "not connected"}
    finally:
        source.stop()


def test_states_of_ranks_reached_directly(runtime_dir: Path) -> None:
    with SyntheticJob(8, "rsd8", interval_s=0.2, runtime_dir=runtime_dir):
        source = LiveSource(resolve("rsd8"), connect_timeout=5.0)
        feed = ModelFeed("rsd8", 8)
        source.start(feed.emit)
        try:
            wait_until(lambda: feed.settled(range(8)) == 8, 20.0, "every rank's state")
            assert not source.on_demand_stale(5)
            result = source.request_states([0, 5], timeout=5.0)
            assert not result.errors, result.errors
            assert {r: s.rank for r, s in result.states.items()} == {0: 0, 5: 5}
            assert all(result.taken_at[r] <= time.time() for r in (0, 5))
        finally:
            source.stop()


def test_a_recording_has_nothing_fresher() -> None:
    source = ReplaySource(Path(__file__).parent / "data" / "f5_hang.ddptop")
    result = source.request_states([0, 1])
    assert not result.states and set(result.errors) == {0, 1}
    assert "recording" in result.errors[0]
    assert not source.live and not source.on_demand_stale(0)
