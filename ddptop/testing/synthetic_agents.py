"""Node agents for a synthetic job: K fake ranks behind each, one endpoint per node.

``python -m ddptop.testing.synthetic --ranks 4096 --ranks-per-agent 8`` serves, beside
every fake rank's own server, one agent endpoint per 8 ranks speaking the node agent's
protocol (:mod:`ddptop.agent.endpoint`): a ``ReporterServer`` with the role "agent" whose
``history`` / ``state`` answer is the catch-up of its ranks, whose stream is their
states as ``RecordEntry`` frames, and whose ``stacks`` / ``fr_trace`` answer is every
rank's part in one :class:`~ddptop.protocol.AgentReply`. Every rank's endpoint names its
agent's port, so a viewer with ``DDPTOP_VIA=agent`` opens one connection per node (what
``bench/agent_fanin.py`` measures against one per rank). With ``--agents-only`` these
endpoints are all there is: n/K listeners instead of n + n/K.

All of it runs on the synthetic job's one ``ServerLoop`` and thread, so 4,096 agents cost
no thread each. The values are the fake ranks' own (:class:`FakeRanks`), so a view
through the agents must equal the view straight from the ranks, except that the catch-up
carries each rank's last :data:`CATCHUP_SAMPLES` samples or fewer (``catchup_samples``: a
budget for the whole job), not the rank's 600 (a real agent sends up to 40,
``ddptop.agent.digest.CATCHUP_SAMPLES``). While a viewer follows a node its ticks keep each
rank's newest samples, as a real agent keeps what its ranks send.

The generator calls :meth:`FakeAgents.tick_node` once per node and tick: that is the one
place where what an agent sends per interval is decided. Every agent also offers the digest
lane (its Hello lists ``"digest"``): a viewer that asks gets the catch-up, then one
:class:`~ddptop.protocol.NodeDigest` per node and tick (every ``span`` ticks for a job of
16,384 ranks or more, nodes taking turns), built by the real agent's
:class:`~ddptop.agent.digest.DigestBuilder` from the same states, so the two ways a viewer
follows a node can be compared on one generator.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from typing import TYPE_CHECKING

from ddptop import protocol as proto
from ddptop.agent.digest import DigestBuilder
from ddptop.net.server import ReporterServer, ServerLoop
from ddptop.protocol import AgentReply, Event, Message, RecordEntry, Request, Sample

if TYPE_CHECKING:
    from ddptop.testing.synthetic_ranks import FakeRanks

AGENT_OUTPUT_CAP = 16 * 1024 * 1024  # an agent forwards K ranks: more room per viewer than one rank
# History in the catch-up: at most the diagnosis window (30 s) plus a margin, what a viewer
# needs to judge rates at once, and at most CATCHUP_BUDGET samples for the whole job (32,768
# ranks get 4 each: a sample costs the generator 8-20 us, so 40 each would be 10-25 s of CPU
# before the first viewer is served). Recomputing a rank's 600 samples per attach, as its own
# server does, would cost minutes; these are kept per rank once computed, so a second viewer
# (the benches alternate) costs only the ticks since. The stream fills the rest in.
CATCHUP_SAMPLES = 40
CATCHUP_BUDGET = 1 << 17


class FakeAgents:
    """One agent endpoint per node of *fake* (``fake.per_node`` consecutive ranks), on *loop*.

    *ticks* is the generator's latest tick per node and *gone* its ranks that stopped for good
    (both shared, read on the loop's thread only).
    """

    def __init__(self, fake: FakeRanks, loop: ServerLoop, token: str | None, ticks: list[int],
                 gone: set[int]) -> None:
        self.fake, self._ticks, self._gone = fake, ticks, gone
        self.servers: list[ReporterServer] = []
        self._recent: dict[int, deque[Sample]] = {}  # rank -> its last CATCHUP_SAMPLES samples
        self._recent_tick: dict[int, int] = {}  # rank -> the tick of the newest one kept
        self._stuck_sent: set[int] = set()  # silent ranks whose stuck report went to subscribers
        self._lanes: dict[int, DigestBuilder] = {}  # node -> its digest lane, while a viewer asked
        self._flushed: dict[int, int] = {}  # node -> the tick of its lane's last digest
        self.catchup_samples = max(1, min(CATCHUP_SAMPLES, CATCHUP_BUDGET // fake.n))
        try:
            for node in range(fake.n_nodes):
                self.servers.append(ReporterServer(
                    "127.0.0.1", 0, token, proto.AGENT_HELLO_RANK, fake.job_id,
                    partial(self._handle, node), loop=loop,
                    max_output=AGENT_OUTPUT_CAP, role="agent", features=[proto.DIGEST_FEATURE]))
        except BaseException:
            self.close()
            raise

    def port_of(self, rank: int) -> int:
        """The port of the agent that serves *rank*."""
        return self.servers[self.fake.node_of(rank)].port

    def tick_node(self, node: int, tick: int) -> None:
        """*node*'s ranks sampled *tick*: forward their states to its agent's subscribers."""
        server = self.servers[node]
        lane = self._lanes.get(node)
        if lane is not None and not server.digest_peers:
            del self._lanes[node]  # its last viewer left: the next one starts from a catch-up
            self._flushed.pop(node, None)
            lane = None
        if not server.subscribers and lane is None:
            return  # nobody listening: build nothing (most of 4,096 agents, most ticks)
        now = time.time()
        subscribed = server.subscribers > 0  # once a node: a count over its viewers
        for rank in self.fake.node_ranks(node):
            if rank in self._gone:
                continue
            if self.fake.heard_tick(rank, tick) == tick:
                sample = self.fake.sample(rank, tick)
                self._keep(rank, tick, sample)
                state = self.fake.state(rank, tick, clients=1, sample=sample)
                entry = RecordEntry(time=now, rank=rank, message=proto.StateMsg(state=state))
                # The lane takes a running state into its next digest; what it returns True
                # for (a final state) goes to digest viewers at once, as to subscribers. With
                # neither, nobody is sent it (what broadcast finds out at 1 us a rank).
                whole = lane.add(entry) if lane is not None else False
                if subscribed or whole:
                    server.broadcast(entry, digest=whole)
            elif rank not in self._stuck_sent and (report := self.fake.stuck_report(rank, now)) is not None:
                # What a real agent does once a rank is silent (agent/stuck.py): read it from
                # outside and tell its viewers where it is stuck, as stacks.
                self._stuck_sent.add(rank)
                stacks = proto.StacksMsg.of_stuck(report)
                server.broadcast(RecordEntry(time=report.time, rank=rank, message=stacks), digest=True)
        if lane is not None and ((tick + node) % lane.span == 0
                                 or tick - self._flushed.get(node, tick) >= lane.span):
            # A wide job's digest spans lane.span ticks, as a real agent's; nodes take turns,
            # as real agents, started apart, do. A turn the generator skipped (it fell behind
            # by more than an interval: see SyntheticJob._run) is taken at the node's next tick,
            # as a real agent's timer would: skipped, it kept the node's ranks 2 s longer
            # without news (healthy ranks turned stale at 32,768 ranks while viewers attached).
            self._flushed[node] = tick
            server.broadcast(lane.flush(now), digest=True)

    def close(self) -> None:
        """Close every agent's listener and viewers."""
        for server in self.servers:
            server.close()
        self.servers = []

    def _keep(self, rank: int, tick: int, sample: Sample) -> None:
        # What a real agent does with every state its ranks send: keep the newest samples. Only
        # while a viewer follows the node (no work for nobody), and only in order: after a gap
        # (nobody followed) history() computes what is missing first.
        kept = self._recent.get(rank)
        if kept is not None and self._recent_tick.get(rank) == tick - 1:
            kept.append(sample)
            self._recent_tick[rank] = tick

    def history(self, rank: int, tick: int) -> list[Sample]:
        """*rank*'s last ``catchup_samples`` samples up to *tick*, computing only those not kept yet."""
        kept = self._recent.get(rank)
        if kept is None:
            kept = self._recent[rank] = deque(maxlen=self.catchup_samples)
        newest = self._recent_tick.get(rank, -1)
        for k in range(max(newest + 1, tick - self.catchup_samples + 1, 0), tick + 1):
            kept.append(self.fake.sample(rank, k))
        self._recent_tick[rank] = max(newest, tick)
        return list(kept)

    def _handle(self, node: int, request: Request) -> Message:
        fake, now, ident, command = self.fake, time.time(), request.id, request.command
        if command == "ping":  # a viewer asks whether this agent is there, as the real one answers
            return AgentReply(time=now, entries=[], id=ident)
        if command not in ("history", "state", "subscribe", "stacks", "fr_trace", "digest"):
            return proto.ErrorMsg(reason=f"unsupported request {command!r}", id=ident)
        lane = command == "digest"
        if lane:  # the digest's catch-up is the history's (the server marked the peer already)
            command = "history"
        entries: list[Event] = []
        tick = self._ticks[node]
        only = set(request.ranks)  # Request.ranks: those ranks only (empty: all the node's)
        for rank in fake.node_ranks(node) if command != "subscribe" else ():
            if rank in self._gone or (only and rank not in only):
                continue
            heard = fake.heard_tick(rank, tick)  # a silent rank: its last state, heard back then
            at = fake.due(rank, heard) if heard != tick else now
            stuck = fake.stuck_report(rank, now)
            message: proto.StateMsg | proto.HistoryMsg | proto.StacksMsg | proto.FrTraceMsg | proto.ErrorMsg
            if command in ("history", "state"):
                last = None
                if command == "history":
                    samples = self.history(rank, heard)
                    history = proto.HistoryMsg(rank=rank, samples=samples)
                    entries.append(RecordEntry(time=at, rank=rank, message=history))
                    if samples and samples[-1].time == fake.due(rank, heard):
                        last = samples[-1]  # the state's own sample: not computed twice
                message = proto.StateMsg(state=fake.state(rank, heard, clients=1, sample=last))
                if stuck is not None:  # the catch-up carries where it is stuck, as agent/serving.py's
                    entries.append(RecordEntry(time=at, rank=rank, message=message))
                    at, message = stuck.time, proto.StacksMsg.of_stuck(stuck)
            elif heard != tick:  # it does not answer: where it is stuck, else why not (agent/serving.py)
                message = proto.StacksMsg.of_stuck(stuck) if stuck else proto.ErrorMsg(reason="no answer")
            elif command == "stacks":
                message = proto.StacksMsg(rank=rank, time=now, threads=fake.stacks(rank, tick), id=ident)
            else:
                message = proto.FrTraceMsg(rank=rank, time=now, json=fake.fr_json(rank, tick), id=ident)
            entries.append(RecordEntry(time=at, rank=rank, message=message))
        if lane:  # what this viewer holds now: the lane's pulses are laid over it
            self._lanes.setdefault(node, DigestBuilder(fake.host(node * fake.per_node))).seed(entries)
        return AgentReply(time=now, entries=entries, id=ident)
