"""The node agents' exchange: every surviving node's recording tells the whole job's ending.

The agents of one job find each other in the job's TCPStore (every rank publishes its
endpoint there, with the port of its node's agent) and each subscribes to every other
agent's "news" (:mod:`ddptop.agent.endpoint`): how each of its ranks ended (the rank's last
state, trimmed, then its exit), where a silent one is stuck, and a beat every
:data:`BEAT_S`. What arrives goes into this node's black box as any local event does, so
``ddptop doctor JOB`` on any node names the first failure and its host.

A peer agent whose connection drops without its closing beat (``ending``) and that cannot be
reached again for :data:`NODE_LOST_AFTER_S` is a lost node: each of its ranks without a
known ending gets a ``RankExit`` with cause ``node_lost`` (the ``node_lost`` finding). Where
the exchange is impossible (agents on loopback, an older agent without "news", a refused
token, no store), :attr:`Exchange.notes` says so, and the job record says what is unknown.

Bounded: news is only endings and stuck reports (not the 1 Hz states), one connection per
peer agent on the live source's one selector thread, the store read at most every
:data:`DISCOVER_S` until every rank is known.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ddptop.client.agents import agent_endpoint
from ddptop.client.handshake import NOT_THE_RANK, TOKEN_MISSING, TOKEN_REFUSED
from ddptop.client.live import LiveSource
from ddptop.client.reachability import agent_label
from ddptop.client.targets import JobTarget, read_store
from ddptop.diagnosis.common import ranks_text
from ddptop.model.rank_view import LOST
from ddptop.protocol import (
    STUB_LOCAL_RANK,
    AgentBeat,
    ConnectionEvent,
    ErrorMsg,
    Event,
    RankExit,
    RankState,
    RecordEntry,
    StateMsg,
)
from ddptop.status import Status
from ddptop.store.discovery import Endpoint

log = logging.getLogger(__name__)

BEAT_S = 2.0  # an agent's beat to the others
# A peer *agent* silent this long (no beat) is looked at as lost: a node that loses power or its
# link closes no connection, its beats just stop. (A silent *rank* is ddptop.status's rule.)
AGENT_SILENT_AFTER_S = 4 * BEAT_S
# Closed or silent, no goodbye, and not back (beat or news) for this long: its node is lost.
NODE_LOST_AFTER_S = 6.0
RETRY_S = 2.0  # a lost peer agent is tried again this often
DISCOVER_S = 1.0  # the store is read this often until every rank's endpoint is known
STORE_TIMEOUT_S = 3.0
LOOPBACK = ("127.", "::1", "localhost")


@dataclass
class PeerAgent:
    """Another node agent of the job, as this one knows it."""

    endpoint: Endpoint
    node: str  # its hostname
    ranks: list[int]
    heard_at: float = 0.0  # wall clock of its last beat or news
    ended: bool = False  # it said its part of the job ended
    lost_since: float | None = None  # taken for lost at (wall clock): closed or silent, not yet back
    gone_at: float = 0.0  # when it went: its connection closed, or its last beat
    retry_at: float = 0.0
    declared_lost: bool = False
    refused: str = ""  # why it cannot exchange with us
    unreached_noted: bool = False  # never heard, and said so
    told_unreachable: bool = False  # its ranks are recorded unreachable from here (beats stopped)
    ranks_ended: set[int] = field(default_factory=set)
    steps: dict[int, int] = field(default_factory=dict)  # each rank's last step, from the beats


class Exchange:
    """This agent's side of the exchange: subscribes to every other agent's news."""

    def __init__(self, job_id: str, token: str | None, on_news: Callable[[Event], None],
                 own_agent: tuple[str, int], clock: Callable[[], float] = time.time, host: str = "",
                 on_store: Callable[[int, list[Endpoint]], None] | None = None) -> None:
        self.job_id = job_id
        self.host = host  # this node's name: whose verdict its reachability events are
        # Told once, the first time the store held every rank's endpoint (kept for viewers here)
        self._on_store = on_store
        self._on_news = on_news
        self._own = own_agent
        self._clock = clock
        self._lock = threading.Lock()
        self.peers: dict[tuple[str, int], PeerAgent] = {}  # guarded by _lock
        self._rank_agent: dict[int, tuple[str, int]] = {}
        self._places: dict[int, tuple[str, str]] = {}  # rank -> (host name, address), from the store
        self.world_size = 0
        self.notes: list[str] = []  # what made the exchange impossible or partial
        self._live = LiveSource(JobTarget(job_id=job_id, world_size=0, endpoints=[], via_agents=True),
                                token=token, read_remains=False, read_stuck=False, news=True)
        self._live.on_agent = self._on_agent_message
        self._store: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self, store: tuple[str, int] | None) -> None:
        """Find the other agents through the job's store at *store* (or as :meth:`add_endpoints`
        is given them) and subscribe to them."""
        self._store = store
        self._live.start(self._event)
        self._thread = threading.Thread(target=self._run, name="ddptop-exchange", daemon=True)
        self._thread.start()

    def note(self, text: str) -> None:
        """Record why the exchange is impossible or partial (once per text)."""
        with self._lock:
            if text not in self.notes:
                self.notes.append(text)
                log.warning("ddptop agent: %s", text)

    def settled(self) -> bool:
        """Every peer agent said its part ended, or was declared lost, or all its ranks ended."""
        with self._lock:
            return all(p.ended or p.declared_lost or p.refused or p.unreached_noted
                       or set(p.ranks) <= p.ranks_ended
                       for p in self.peers.values())

    def settle(self, grace_s: float) -> None:
        """Wait (bounded) until :meth:`settled`: the job ended here, the others may still tell how."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not self.settled():
            self._stop.wait(0.1)

    def close(self) -> None:
        """Stop exchanging."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STORE_TIMEOUT_S + 2.0)
        self._live.stop()

    @property
    def bytes_in(self) -> int:
        """Bytes received from the other agents so far."""
        return self._live.bytes_in

    def summary(self) -> str:
        """One line for the job record: with whom news was exchanged, and what was impossible."""
        with self._lock:
            peers = list(self.peers.values())
            notes = list(self.notes)
        if not peers and not notes:
            return ""
        lost = [p.node or p.endpoint.host for p in peers if p.declared_lost]
        heard = sum(1 for p in peers if p.heard_at)
        text = f"exchanged news with {heard} of {len(peers)} other node agent(s)"
        if lost:
            text += f"; lost: {', '.join(lost)}"
        return "; ".join([text, *notes])

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        next_discover = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if self._store is not None and now >= next_discover and not self._all_known():
                self._discover()
                next_discover = time.monotonic() + DISCOVER_S
            self._check_lost()
            self._stop.wait(0.2)

    def _all_known(self) -> bool:
        return bool(self.world_size) and len(self._rank_agent) >= self.world_size

    def _discover(self) -> None:
        assert self._store is not None
        try:
            world, endpoints = read_store(self._store[0], self._store[1], STORE_TIMEOUT_S)
        except Exception as exc:  # the store is gone (the job ended) or unreachable
            log.debug("ddptop exchange: store %s:%d: %s", *self._store, exc)
            return
        self.add_endpoints(endpoints, world)
        if self._on_store is not None and self._all_known():
            told, self._on_store = self._on_store, None
            told(world, [e for e in endpoints if e.job_id == self.job_id])

    def places(self) -> dict[int, tuple[str, str]]:
        """Each rank's host name and address, as the job's store published them."""
        with self._lock:
            return dict(self._places)

    def add_endpoints(self, endpoints: list[Endpoint], world: int) -> None:
        """Ranks' endpoints as published in the job's store: subscribe to each new agent."""
        self.world_size = max(self.world_size, world)
        with self._lock:
            self._places.update((e.rank, (e.node, e.host)) for e in endpoints if e.job_id == self.job_id)
        by_agent: dict[tuple[str, int], list[Endpoint]] = {}
        for endpoint in endpoints:
            if endpoint.job_id != self.job_id or endpoint.via_agent is None:
                continue
            self._rank_agent[endpoint.rank] = endpoint.via_agent
            by_agent.setdefault(endpoint.via_agent, []).append(endpoint)
        unserved = [e.rank for e in endpoints if e.via_agent is None]
        if unserved:
            have = "has" if len(unserved) == 1 else "have"
            self.note(f"{_span(unserved)} {have} no node agent (not started by `ddptop launch`)")
        for where, served in by_agent.items():
            if where == self._own:
                continue
            ranks = sorted(e.rank for e in served)
            if where[0].startswith(LOOPBACK) and not self._own[0].startswith(LOOPBACK):
                # Another host's loopback (a node agent on one host shares loopback with ours).
                self.note(f"the node agent of {_span(ranks)} serves on loopback only "
                          "(`ddptop launch --bind`): its news cannot reach this node")
                continue
            with self._lock:
                known = self.peers.get(where)
                if known is not None and known.ranks == ranks:
                    continue
                self.peers[where] = PeerAgent(endpoint=agent_endpoint(served[0]), node=served[0].node,
                                              ranks=ranks)
            self._live.add_agent(agent_endpoint(served[0]), ranks)

    def _check_lost(self) -> None:
        now = self._clock()
        declare: list[PeerAgent] = []
        silent: list[PeerAgent] = []
        retry: list[PeerAgent] = []
        unreached: list[PeerAgent] = []
        with self._lock:
            for peer in self.peers.values():
                if peer.ended or peer.declared_lost or peer.refused:
                    continue
                if peer.lost_since is None and peer.heard_at and now - peer.heard_at >= AGENT_SILENT_AFTER_S:
                    # Its beats stopped with its connection open: unreachable since it last spoke
                    # (a cut link, a switch, a hung or dead host), lost if it stays so.
                    peer.lost_since, peer.gone_at, peer.retry_at = now, peer.heard_at, now
                    silent.append(peer)
                if peer.lost_since is None:
                    continue
                if now - peer.lost_since >= NODE_LOST_AFTER_S and peer.heard_at:
                    peer.declared_lost = True
                    declare.append(peer)
                elif now - peer.lost_since >= NODE_LOST_AFTER_S and not peer.unreached_noted:
                    peer.unreached_noted = True  # never heard: not lost, unknown (noted below)
                    unreached.append(peer)
                elif now >= peer.retry_at:
                    peer.retry_at = now + RETRY_S
                    retry.append(peer)
        for peer in silent:
            self._tell_reach(peer, Status.UNREACHABLE, now)
        for peer in retry:
            self._live.add_agent(peer.endpoint, peer.ranks)
        for peer in declare:
            self._declare_lost(peer)
        for peer in unreached:
            self.note(f"the node agent of {peer.node or peer.endpoint.host} ({_span(peer.ranks)}) could not "
                      f"be reached at {peer.endpoint.host}:{peer.endpoint.port}: what happened there is "
                      "unknown here")

    def _tell_reach(self, peer: PeerAgent, status: str, now: float) -> None:
        """Into this node's recording: *peer*'s ranks unreachable from here since it last spoke
        (its connection open, its beats stopped), or reachable again."""
        label = agent_label(peer.endpoint)  # agent_endpoint() kept the node name of its ranks
        if status == Status.UNREACHABLE:
            peer.told_unreachable = True
            why = (f"{label}: no beat for {now - peer.heard_at:.0f} s, its connection open (no close "
                   "came: a cut link, a switch or a hung host look alike from here)")
            log.warning("ddptop agent: %s", why)
        else:
            peer.told_unreachable = False
            why = f"{label} answers again"
        for rank in peer.ranks:
            self._on_news(ConnectionEvent(time=now, rank=rank, status=status, reason=why,
                                          since=peer.heard_at if status == Status.UNREACHABLE else 0.0,
                                          seen_by=self.host))

    def _declare_lost(self, peer: PeerAgent) -> None:
        """Its node vanished: every rank of it without a known ending is lost with it."""
        gone = peer.gone_at or peer.lost_since or self._clock()
        for rank in peer.ranks:
            if rank in peer.ranks_ended:
                continue
            if rank in peer.steps:  # the step it was last seen at, as its agent's last beat said
                state = RankState(rank=rank, local_rank=STUB_LOCAL_RANK, world_size=self.world_size,
                                  host=peer.node, pid=0, job_id=self.job_id, time=gone, step=peer.steps[rank])
                self._on_news(RecordEntry(time=gone, rank=rank, message=StateMsg(state=state)))
            self._on_news(RankExit(time=gone, rank=rank, pid=0,
                                   host=peer.node or peer.endpoint.host, cause="node_lost"))
        log.warning("ddptop agent: node %s (%s) lost: its agent and ranks %s unreachable for %.0f s",
                    peer.node, peer.endpoint.host, _span(peer.ranks), NODE_LOST_AFTER_S)

    # ------------------------------------------------------------ the live source's thread

    def _peer_of_rank(self, rank: int) -> PeerAgent | None:
        where = self._rank_agent.get(rank)
        return self.peers.get(where) if where is not None else None

    def _event(self, event: Event) -> None:
        refused, back = "", False
        with self._lock:
            peer = self._peer_of_rank(event.rank)
            if peer is None:
                return
            if isinstance(event, ConnectionEvent):
                if event.status == LOST and any(w in event.reason for w in (TOKEN_MISSING, TOKEN_REFUSED,
                                                                            NOT_THE_RANK)):
                    refused = peer.refused = event.reason  # alive, but not ours to hear: no lost node
                elif event.status == LOST and peer.lost_since is None and not peer.ended:
                    peer.lost_since = peer.gone_at = self._clock()
                    peer.retry_at = peer.lost_since + RETRY_S
                node = peer.node or peer.endpoint.host
            else:  # news: it lives
                node = ""
                back = self._heard(peer)
                if isinstance(event, RankExit):
                    peer.ranks_ended.add(event.rank)
        # (The live source's own "unreachable", at 10 s, is not needed here: the beats' rule
        # in _check_lost says it at 8 s, for every peer that spoke.)
        if back:
            self._tell_reach(peer, Status.CONNECTED, self._clock())
        if refused:
            self.note(f"the node agent of {node} refused this one ({refused[:120]}): another DDPTOP_TOKEN?")
        if isinstance(event, RecordEntry | RankExit):  # the agent's connection is never the rank's loss
            self._on_news(event)

    def _heard(self, peer: PeerAgent) -> bool:
        """Under self._lock: *peer* spoke; True when its ranks were recorded unreachable (and
        not declared lost): they are reachable again."""
        peer.heard_at = self._clock()
        peer.lost_since = None
        return peer.told_unreachable and not peer.declared_lost

    def _on_agent_message(self, agent: Endpoint, message: AgentBeat | ErrorMsg) -> None:
        back = False
        with self._lock:
            peer = self.peers.get((agent.host, agent.port))
            if peer is None:
                return
            if isinstance(message, ErrorMsg):
                peer.refused = message.reason
            else:
                back = self._heard(peer)
                peer.ended = peer.ended or message.ending
                peer.steps.update(zip(message.ranks, message.steps, strict=False))
        if back:
            self._tell_reach(peer, Status.CONNECTED, self._clock())
        if isinstance(message, ErrorMsg):
            self.note(f"the node agent of {peer.node or agent.host} cannot exchange news "
                      f"(an older ddptop?): {message.reason}")


def _span(ranks: list[int]) -> str:
    return ranks_text(ranks)
