"""The node agents' exchange on its own, on real sockets (loopback), without torch.

One :class:`~ddptop.agent.exchange.Exchange` subscribes to the news of real agent endpoints
(:class:`~ddptop.agent.endpoint.NodeEndpoint`): what they tell arrives, and only news (not
their ranks' 1 Hz states); an agent that says goodbye is not lost, one that vanishes is a
lost node whose ranks without an ending get a ``node_lost`` exit; an older agent that does
not know "news" is noted, never taken for lost. The job's store is replaced by the
endpoints it would hold (:meth:`Exchange.add_endpoints`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from ddptop.agent import exchange as exchange_mod
from ddptop.agent.endpoint import NodeEndpoint
from ddptop.agent.exchange import Exchange
from ddptop.agent.serving import news_state
from ddptop.net.server import ReporterServer, ServerLoop
from ddptop.protocol import (
    AgentBeat,
    ConnectionEvent,
    ErrorMsg,
    Event,
    Message,
    RankExit,
    RankState,
    RecordEntry,
    Request,
    StateMsg,
)
from ddptop.store.discovery import Endpoint
from tests.jobs import wait_until
from tests.stand_in_agent import StandInAgent

JOB = "xjob"
TOKEN = "exchange-test-token"


def _endpoints(port: int, ranks: list[int], node: str) -> list[Endpoint]:
    return [Endpoint(job_id=JOB, rank=r, world_size=6, host="127.0.0.1", port=1, pid=1, node=node,
                     agent_port=port) for r in ranks]


def _state(rank: int, step: int, status: str = "running") -> RankState:
    return RankState(rank=rank, local_rank=0, world_size=6, host="n", pid=100 + rank, job_id=JOB,
                     time=time.time(), step=step, status=status, env={"BIG": "x" * 1000})


class OlderAgent:
    """An agent endpoint of a ddptop that does not know "news" (answers as it would)."""

    def __init__(self) -> None:
        self.loop = ServerLoop(wakeable=True)
        self.server = ReporterServer("127.0.0.1", 0, TOKEN, -1, JOB, self._handle, loop=self.loop,
                                     role="agent")
        self.port = self.server.port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _handle(self, request: Request) -> Message:
        return ErrorMsg(reason=f"unsupported request {request.command!r}", id=request.id)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.loop.poll(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.server.close()
        self.loop.close()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    # Shorter beats and lost-node delay: the same code path, waited on by conditions.
    monkeypatch.setattr(exchange_mod, "NODE_LOST_AFTER_S", 2.0)
    monkeypatch.setattr(exchange_mod, "RETRY_S", 0.5)


@pytest.fixture
def agents() -> Iterator[tuple[NodeEndpoint, NodeEndpoint, OlderAgent]]:
    made: list[NodeEndpoint] = []
    older = OlderAgent()
    try:
        for _ in range(2):
            made.append(NodeEndpoint("127.0.0.1", 0, TOKEN, JOB, StandInAgent()))
        yield made[0], made[1], older
    finally:
        for endpoint in made:
            endpoint.close()
        older.close()


def test_news_arrives_goodbye_is_not_loss_vanished_node_is_lost_older_agent_noted(
        quick: None, agents: tuple[NodeEndpoint, NodeEndpoint, OlderAgent]) -> None:
    b, c, older = agents
    told: list[Event] = []
    ours = ("127.0.0.1", 9)  # this node's own agent: never subscribed to
    ex = Exchange(JOB, TOKEN, told.append, ours)
    ex.start(None)
    try:
        ex.add_endpoints(_endpoints(9, [0, 1], "node-a") + _endpoints(b.port, [2, 3], "node-b")
                         + _endpoints(c.port, [4, 5], "node-c") + _endpoints(older.port, [6], "node-d"), 7)
        assert sorted(p.node for p in ex.peers.values()) == ["node-b", "node-c", "node-d"]
        # The older agent refuses "news": noted, never lost.
        wait_until(lambda: any("node-d" in n and "older" in n for n in ex.notes), 10.0,
                   "the older agent noted")
        # Beats make the others heard; a 1 Hz state of theirs is not news and never comes.
        wait_until(lambda: (ex.peers[("127.0.0.1", b.port)].heard_at > 0 and
                   ex.peers[("127.0.0.1", c.port)].heard_at > 0) or _beat(b, c), 10.0, "beats from b and c")
        b.publish(RecordEntry(time=time.time(), rank=2, message=StateMsg(state=_state(2, 40))))
        # Rank 2's ending, as node b's agent tells it: its last state (trimmed), then its exit.
        b.publish(RecordEntry(time=time.time(), rank=2, message=StateMsg(state=news_state(_state(2, 41)))),
                  news=True)
        b.publish(RankExit(time=time.time(), rank=2, pid=102, host="node-b", signal="SIGKILL"), news=True)
        wait_until(lambda: any(isinstance(e, RankExit) and e.rank == 2 for e in told), 10.0, "rank 2's exit")
        states = [e for e in told if isinstance(e, RecordEntry) and isinstance(e.message, StateMsg)]
        assert [s.message.state.step for s in states] == [41], states  # the news only, not the 1 Hz state
        assert states[0].message.state.env == {}
        # Node c says goodbye, then closes: not lost. Node b vanishes without a word: lost.
        c.publish(AgentBeat(time=time.time(), host="node-c", ranks=[4, 5], ending=True), news=True)
        wait_until(lambda: ex.peers[("127.0.0.1", c.port)].ended, 10.0, "node c's goodbye")
        c.close()
        b.server.close()  # its sockets go; no goodbye was said
        wait_until(ex.settled, 20.0, "the exchange to settle")
        lost = [e for e in told if isinstance(e, RankExit) and e.cause == "node_lost"]
        assert [(e.rank, e.host) for e in lost] == [(3, "node-b")], lost  # rank 2's ending was known
        summary = ex.summary()
        assert "lost: node-b" in summary and "node-c" not in summary.split("lost:")[1], summary
    finally:
        ex.close()


def _beat(*endpoints: NodeEndpoint) -> bool:
    for endpoint in endpoints:
        endpoint.publish(AgentBeat(time=time.time(), host="n", ranks=[]), news=True)
    return False


def test_a_silent_agent_is_lost_from_when_it_last_spoke_a_beating_one_never(
        monkeypatch: pytest.MonkeyPatch, agents: tuple[NodeEndpoint, NodeEndpoint, OlderAgent]) -> None:
    """A node that loses its link closes no connection: its beats just stop. It is lost once
    silent and unreachable long enough, its ranks' end dated to its last beat; a peer that
    goes on beating is never lost."""
    monkeypatch.setattr(exchange_mod, "AGENT_SILENT_AFTER_S", 1.0)
    monkeypatch.setattr(exchange_mod, "NODE_LOST_AFTER_S", 1.0)
    monkeypatch.setattr(exchange_mod, "RETRY_S", 0.5)
    b, c, _older = agents
    told: list[Event] = []
    ex = Exchange(JOB, TOKEN, told.append, ("127.0.0.1", 9), host="node-a")
    ex.start(None)
    try:
        ex.add_endpoints(_endpoints(b.port, [2, 3], "node-b") + _endpoints(c.port, [4, 5], "node-c"), 6)
        peer_b, peer_c = ex.peers[("127.0.0.1", b.port)], ex.peers[("127.0.0.1", c.port)]
        wait_until(lambda: peer_b.heard_at > 0 or _beat(b), 10.0, "node b's beat")
        last_beat = peer_b.heard_at
        # Node b falls silent (connected, nothing more); node c beats on until b is declared.
        wait_until(lambda: peer_b.declared_lost or _beat(c), 20.0, "node b taken for lost")
        assert not peer_c.declared_lost and peer_c.lost_since is None
        lost = [e for e in told if isinstance(e, RankExit) and e.cause == "node_lost"]
        assert sorted(e.rank for e in lost) == [2, 3] and all(e.time == last_beat for e in lost), lost
        # First unreachable, since its last beat, as this agent (node a) saw it: a viewer that
        # reads node a's record after the cut tells whose word and time it is.
        cut = [e for e in told if isinstance(e, ConnectionEvent) and e.status == "unreachable"]
        assert sorted(e.rank for e in cut) == [2, 3], told
        assert all((e.since, e.seen_by) == (last_beat, "node-a") for e in cut), cut
    finally:
        ex.close()


def test_an_agent_with_another_token_is_noted_never_lost(quick: None) -> None:
    other = NodeEndpoint("127.0.0.1", 0, "not-this-jobs-token", JOB, StandInAgent())
    ex = Exchange(JOB, TOKEN, lambda e: None, ("127.0.0.1", 9))
    ex.start(None)
    try:
        ex.add_endpoints(_endpoints(other.port, [2, 3], "node-x"), 4)
        peer = ex.peers[("127.0.0.1", other.port)]
        wait_until(lambda: any("node-x" in n and "refused" in n for n in ex.notes), 10.0, "the refusal noted")
        assert peer.refused and ex.settled()
        assert not peer.declared_lost and peer.lost_since is None
    finally:
        ex.close()
        other.close()
