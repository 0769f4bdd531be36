"""The live source: one selector thread holds a subscription to every rank of a job.

A single thread (not one per rank) so that attaching to 4096 ranks costs one thread and
a few file descriptors' worth of work. Each connection walks header -> Hello -> (token
proof) -> subscribe -> history; then state frames stream in. A rank that closes its
socket is "lost" (with its last words if it left any); one whose state stops arriving
is "stale" (decided by the model from time, not here). Requests (stacks, FR) are sent on
the same sockets and their replies routed back to the blocked caller. Ranks reached
through their node agent (:mod:`ddptop.client.agents`) share its one connection: it sends
their events ready-made, and one request asks all of them.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence

from ddptop.client import agents
from ddptop.client.collect import end_after_close, ended_before, stuck_stacks
from ddptop.client.handshake import Handshake, JobTokens
from ddptop.client.live_agents import AgentPeers
from ddptop.client.live_requests import Peer
from ddptop.client.targets import JobTarget
from ddptop.errors import AuthError, ProtocolError
from ddptop.model.rank_view import CONNECTED, LOST
from ddptop.net import stream
from ddptop.net.loop import ServerLoop
from ddptop.protocol import (
    AgentBeat,
    AuthResult,
    ConnectionEvent,
    ErrorMsg,
    FrTraceMsg,
    Hello,
    HistoryMsg,
    Message,
    RecordEntry,
    Request,
    StacksMsg,
    StateMsg,
)
from ddptop.source import Emit, Foreground, PulseSink
from ddptop.status import silent_after_s
from ddptop.store.discovery import Endpoint
from ddptop.wire import encode_frame, header_bytes

log = logging.getLogger(__name__)

# A peer silent by the agent's rule (ddptop.status): look for the node agent's .stuck report.
STUCK_AFTER_S = silent_after_s()
STUCK_EVERY_S = 1.0
# From this many ranks the dashboard asks node agents for their digest lane: below it a frame
# per rank per sample costs little and the rank detail keeps every field fresh.
DIGEST_FROM_RANKS = 1024
RECV_BYTES = 1 << 20  # per read: a node agent's catch-up of 512 ranks comes in one
# From this many connections frames gather GATHER_S between polls (ServerLoop.poll explains).
GATHER_FROM_PEERS, GATHER_S = 64, 0.01


class LiveSource(AgentPeers):
    """Subscribes to every rank of *target* and emits what they send."""

    live = True

    def __init__(self, target: JobTarget, token: str | None = None,
                 connect_timeout: float = 5.0, read_remains: bool = True, read_stuck: bool = True,
                 news: bool = False, history: bool = True, digest: bool = False) -> None:
        self.target = target
        # Node agents that offer it send one digest per interval instead of a frame per rank
        # per sample (ddptop.client.digest_view): the dashboard of a big job asks for it.
        self._digest = digest
        # Each rank's window of samples (up to an hour of them): what a one-shot snapshot,
        # which shows only the present, does not ask for.
        self._history = history
        # The node agents' exchange (ddptop.agent.exchange): ask other agents for "news" only,
        # and hand their beats and refusals to on_agent.
        self._news = news
        self.bytes_in = 0  # bytes received from every peer (a benchmark's measure)
        self.foreground = Foreground()  # a dashboard's redraws and keys go first
        self.on_agent: Callable[[Endpoint, AgentBeat | ErrorMsg], None] | None = None
        # A viewer on the rank's host reads a dead rank's last words from the runtime directory
        # (a rank on another host: its node agent tells them); the node agent reads them itself
        # (with more: exit status, workers' crashes) and says no.
        self._read_remains = read_remains
        # ... and where a silent rank is stuck, from the node agent's report (the agent itself
        # writes those reports and says no).
        self._read_stuck = read_stuck
        self.description = f"job {target.job_id} ({target.world_size} ranks)"
        self._tokens = JobTokens(token)  # each job's token file read once, not per connection
        self._connect_timeout = connect_timeout
        # The socket engine's loop (ddptop.net): one selector and its wake-up pair, as a rank's
        # server has; this source's peers are what it serves.
        self._loop = ServerLoop(wakeable=True)
        self._peers: dict[int, Peer] = {}  # ranks reached directly
        self._agent_peers: list[Peer] = []  # node agents, each serving a few ranks
        self._via: dict[int, Peer] = {}  # rank -> the node agent's peer that serves it
        self._emit: Emit | None = None
        self._pulses: PulseSink | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards peer output buffers and waiting futures
        # Peers given output by other threads (requests), flushed by the selector thread.
        # A set, not a scan of every peer per wake-up: at 4096 ranks that scan was ~40 %
        # of the ingest CPU.
        self._queued: set[int] = set()
        # added after start, connected by the thread: (endpoint, ranks a node agent serves)
        self._to_connect: list[tuple[Endpoint, tuple[int, ...]]] = []
        # Ranks whose socket closed, waiting (bounded) for their last words: rank -> (peer, why, since)
        self._closing: dict[int, tuple[Peer, str, float]] = {}
        self._next_id = 0
        self._stuck_check = 0.0
        self._reach_check = 0.0  # next look at the node agents' silence (ddptop.client.reachability)

    @property
    def connections(self) -> int:
        """Connections this source holds: one per rank reached directly, one per node agent."""
        return len(self._peers) + len(self._agent_peers)

    def start(self, emit: Emit, pulses: PulseSink | None = None) -> None:
        """Connect to every rank (non-blocking) and start the selector thread."""
        self._emit, self._pulses = emit, pulses
        for event in ended_before(self.target, time.time()):
            emit(event)
        direct, served = agents.split(self.target.endpoints, self.target.via_agents)
        for endpoint in direct:
            self._connect(endpoint)
        for agent, ranks in served.items():
            self._connect(agent, tuple(ranks))
        self._thread = threading.Thread(target=self._run, name="ddptop-live", daemon=True)
        self._thread.start()

    def add_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        """Connect to ranks that appeared after :meth:`start` (thread-safe; the node agent
        starts before any rank exists)."""
        with self._lock:
            self._to_connect.extend((e, ()) for e in endpoints)
        self._wake()

    def add_agent(self, agent: Endpoint, ranks: Sequence[int]) -> None:
        """Connect to a node agent that serves *ranks* (thread-safe; again after it was lost)."""
        with self._lock:
            self._agent_peers = [p for p in self._agent_peers if p.endpoint != agent or p.sock is not None]
            self._to_connect.append((agent, tuple(ranks)))
        self._wake()

    def stop(self) -> None:
        """Close every connection and end the thread."""
        self._stop.set()
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        for peer in [*self._peers.values(), *self._agent_peers]:
            self._close(peer, None)
        self._loop.close()

    def _connect(self, endpoint: Endpoint, serves: tuple[int, ...] = ()) -> None:
        peer = Peer(endpoint=endpoint, serves=serves, owner=self._serve)
        if serves:
            self._agent_peers.append(peer)
            self._via.update((r, peer) for r in serves)
        else:
            self._peers[endpoint.rank] = peer
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET)
            sock.setblocking(False)
            sock.connect_ex((endpoint.host, endpoint.port))
        except OSError as exc:
            self._lost(peer, f"cannot connect: {exc}")
            return
        peer.sock = sock
        peer.out += header_bytes()
        self._loop.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, peer)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._closing:
                self._settle_closing()
            if self._to_connect:
                with self._lock:
                    new, self._to_connect = self._to_connect, []
                for endpoint, serves in new:
                    self._connect(endpoint, serves)
            if self._queued:
                with self._lock:
                    for rank in self._queued:
                        peer = self._peers.get(rank) or self._via.get(rank)
                        if peer is not None and peer.sock is not None and peer.out:
                            self._flush(peer)
                    self._queued.clear()
            if self._read_stuck and time.monotonic() >= self._stuck_check:
                self._deliver_stuck()
            if self._agent_peers and time.monotonic() >= self._reach_check:
                self._check_reach()
            gather = GATHER_S if self.connections >= GATHER_FROM_PEERS else 0.0
            self._loop.poll(0.1 if self._closing else 0.5, gather)

    def _serve(self, peer: Peer, events: int) -> None:
        """The loop saw *events* on *peer*'s socket."""
        if events & selectors.EVENT_WRITE and peer.sock is not None:
            with self._lock:
                self._flush(peer)
            peer.connected = peer.sock is not None
        if events & selectors.EVENT_READ and peer.sock is not None:
            self._read(peer)

    def _deliver_stuck(self) -> None:
        """Where silent ranks of this host are stuck, as their node agent read it from outside
        (a file per rank): only peers silent for STUCK_AFTER_S are looked at, each report once."""
        now = time.monotonic()
        self._stuck_check = now + STUCK_EVERY_S
        for peer in list(self._peers.values()):
            if peer.sock is None or now - peer.heard_at < STUCK_AFTER_S:
                continue
            msg = stuck_stacks(peer.endpoint)
            if msg is not None and msg.time > peer.stuck_time:
                peer.stuck_time = msg.time
                self._deliver(RecordEntry(time=msg.time, rank=peer.endpoint.rank, message=msg))

    def _flush(self, peer: Peer) -> None:
        assert peer.sock is not None
        try:
            stream.send_queued(peer.sock, peer.out)
        except OSError as exc:
            self._failed(peer, exc)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.out else 0)
        try:
            self._loop.selector.modify(peer.sock, events, peer)
        except (KeyError, ValueError):
            pass

    def _read(self, peer: Peer) -> None:
        assert peer.sock is not None
        self.foreground.give_way()
        try:
            got = stream.receive(peer.sock, peer.buf, RECV_BYTES)
        except OSError as exc:
            self._failed(peer, exc)
            return
        except ProtocolError as exc:
            self._lost(peer, str(exc))
            return
        if got is None:
            self._lost(peer, "connection closed by the rank")
            return
        self.bytes_in += got.nbytes
        for message in got.messages:
            self._on_message(peer, message)

    def _on_message(self, peer: Peer, message: Message) -> None:
        rank, now = peer.endpoint.rank, time.time()
        if isinstance(message, Hello | AuthResult):
            try:
                if isinstance(message, Hello):
                    peer.handshake = Handshake(peer.endpoint, self._tokens)
                    proof = peer.handshake.on_hello(message)
                    if proof is not None:
                        self._send(peer, proof)
                elif peer.handshake is not None:
                    peer.handshake.on_result(message)
            except AuthError as exc:
                self._lost(peer, str(exc))
                return
            if peer.handshake is not None and peer.handshake.done:
                self._ready(peer)
            return
        if peer.serves:
            self._from_agent(peer, message)
            return
        ident = getattr(message, "id", 0)
        fut = peer.waiting.pop(ident, None) if ident else None
        if fut is not None:
            fut.set_result(message)
        if isinstance(message, StateMsg):
            peer.heard_at = time.monotonic()
        if isinstance(message, StateMsg | HistoryMsg | StacksMsg | FrTraceMsg | ErrorMsg):
            self._deliver(RecordEntry(time=now, rank=rank, message=message))

    def _ready(self, peer: Peer) -> None:
        peer.ready = True
        if peer.serves:
            self._agent_ready(peer)
            return
        self._deliver(ConnectionEvent(time=time.time(), rank=peer.endpoint.rank, status=CONNECTED))
        if self._history:
            self._send(peer, Request(command="history", id=0))
        self._send(peer, Request(command="subscribe", id=0))

    def _send(self, peer: Peer, message: Message) -> None:
        with self._lock:
            peer.out += encode_frame(message)
            if peer.sock is not None:
                self._flush(peer)

    def _lost(self, peer: Peer, reason: str) -> None:
        was_ready = peer.ready
        self._close(peer, reason)
        if self._stop.is_set():
            return
        if peer.serves:  # the node agent is gone, and with it the view of its ranks
            label = f"node agent at {peer.endpoint.host}:{peer.endpoint.port}"
            why = reason if reason.startswith(label) else f"{label}: {reason}"
            for rank in peer.serves:
                self._deliver(ConnectionEvent(time=time.time(), rank=rank, status=LOST, reason=why))
            return
        if was_ready and self._read_remains:
            # The rank may have left last words on the way out (same host only). A rank whose
            # socket closed while its process still lives is on its way out, not vanished: its
            # words may come a moment later, so it is looked at again before it is called lost.
            self._closing[peer.endpoint.rank] = (peer, reason, time.monotonic())
            self._settle_closing()
            return
        self._deliver(ConnectionEvent(time=time.time(), rank=peer.endpoint.rank, status=LOST, reason=reason))

    def _settle_closing(self) -> None:
        """Deliver the end of ranks whose connection closed: their last words as soon as they
        are there, else "lost" once the process is gone or the wait ran out."""
        for rank, (peer, reason, since) in list(self._closing.items()):
            events = end_after_close(peer.endpoint, reason, time.monotonic() - since, time.time())
            if events is not None:  # else not yet: looked at again at the next turn of the loop
                del self._closing[rank]
                for event in events:
                    self._deliver(event)

    def _close(self, peer: Peer, reason: str | None) -> None:
        peer.ready = False
        for fut in peer.waiting.values():
            if not fut.done():
                fut.set_exception(ProtocolError(reason or "connection closed"))
        peer.waiting.clear()
        if peer.sock is not None:
            self._loop.unregister(peer.sock)
            peer.sock.close()
            peer.sock = None
