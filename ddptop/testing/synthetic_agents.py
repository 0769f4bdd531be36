"""Node agents for a synthetic job: K fake ranks behind each, one endpoint per node.

``python -m ddptop.testing.synthetic --ranks 4096 --ranks-per-agent 8`` serves, beside
every fake rank's own server, one agent endpoint per 8 ranks speaking the node agent's
protocol (:mod:`ddptop.agent.endpoint`): a ``ReporterServer`` with the role "agent" whose
``history`` / ``state`` answer is the catch-up of its ranks, whose stream is their
states as ``RecordEntry`` frames, and whose ``stacks`` / ``fr_trace`` answer is every
rank's part in one :class:`~ddptop.protocol.AgentReply`. Every rank's endpoint names its
agent's port, so a viewer with ``DDPTOP_VIA=agent`` opens one connection per node (what
``bench/agent_fanin.py`` measures against one per rank).

All of it runs on the synthetic job's one ``ServerLoop`` and thread, so 512 agents cost
no thread each. The values are the fake ranks' own (:class:`FakeRanks`), so a view
through the agents must equal the view straight from the ranks.
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING

from ddptop import protocol as proto
from ddptop.net.server import ReporterServer, ServerLoop
from ddptop.protocol import AgentReply, Event, Message, RecordEntry, Request

if TYPE_CHECKING:
    from ddptop.testing.synthetic import FakeRanks

AGENT_OUTPUT_CAP = 16 * 1024 * 1024  # an agent forwards K ranks: more room per viewer than one rank


class FakeAgents:
    """One agent endpoint per *per_node* consecutive ranks of *fake*, on *loop*."""

    def __init__(self, fake: FakeRanks, per_node: int, loop: ServerLoop, token: str | None,
                 ticks: list[int]) -> None:
        self.fake, self.per_node, self._ticks = fake, per_node, ticks
        self.servers: list[ReporterServer] = []
        try:
            for node in range((fake.n + per_node - 1) // per_node):
                self.servers.append(ReporterServer(
                    "127.0.0.1", 0, token, -1, fake.job_id, partial(self._handle, node), loop=loop,
                    max_output=AGENT_OUTPUT_CAP, role="agent"))
        except BaseException:
            self.close()
            raise

    def port_of(self, rank: int) -> int:
        """The port of the agent that serves *rank*."""
        return self.servers[rank // self.per_node].port

    def publish(self, rank: int, tick: int) -> None:
        """Forward *rank*'s state at *tick* to its agent's subscribers (if it has any)."""
        server = self.servers[rank // self.per_node]
        if server.subscribers:
            state = self.fake.state(rank, tick, clients=1)
            server.broadcast(RecordEntry(time=time.time(), rank=rank, message=proto.StateMsg(state=state)))

    def close(self) -> None:
        """Close every agent's listener and viewers."""
        for server in self.servers:
            server.close()
        self.servers = []

    def _ranks(self, node: int) -> range:
        return range(node * self.per_node, min(self.fake.n, (node + 1) * self.per_node))

    def _handle(self, node: int, request: Request) -> Message:
        fake, now, ident = self.fake, time.time(), request.id
        entries: list[Event] = []
        for rank in self._ranks(node) if request.command != "subscribe" else ():
            tick = self._ticks[rank]
            message: proto.StateMsg | proto.HistoryMsg | proto.StacksMsg | proto.FrTraceMsg | proto.ErrorMsg
            if request.command in ("history", "state"):
                if request.command == "history":
                    history = proto.HistoryMsg(rank=rank, samples=fake.history(rank, tick))
                    entries.append(RecordEntry(time=now, rank=rank, message=history))
                message = proto.StateMsg(state=fake.state(rank, tick, clients=1))
            elif request.command == "stacks":
                message = proto.StacksMsg(rank=rank, time=now, threads=fake.stacks(rank, tick), id=ident)
            elif request.command == "fr_trace":
                message = proto.FrTraceMsg(rank=rank, time=now, json=fake.fr_json(rank, tick), id=ident)
            else:
                return proto.ErrorMsg(reason=f"unsupported request {request.command!r}", id=ident)
            entries.append(RecordEntry(time=now, rank=rank, message=message))
        return AgentReply(time=now, entries=entries, id=ident)
