"""The node's one endpoint: every local rank's events, to any number of viewers.

A viewer of a 512-node job opens 512 connections, not 4096: it connects to each node's
agent (``ddptop launch``), which already holds a subscription to every rank of its host
and forwards what they send as the same events a viewer would have made itself
(``RecordEntry``, ``ConnectionEvent``, ``RankExit``). The agent also knows what a viewer
connecting to the ranks could not: how a dead rank ended, and where a silent one is stuck.

It is a :class:`~ddptop.net.server.ReporterServer` with the role "agent", so the
handshake, the token, and every limit on peers (output, request rate, idle time, number)
are the ranks' own. Requests get an :class:`~ddptop.protocol.AgentReply`:

* ``history`` (and ``state``): the catch-up, everything the agent knows about each rank
  now (history, last state, stuck report, connection, exit);
* ``subscribe``: from then on every event, as it arrives;
* ``news`` (the other node agents of the job, :mod:`ddptop.agent.exchange`): the ranks'
  endings and stuck reports so far, then each new one, and the agent's beat;
* ``stacks`` / ``fr_trace``: asked of every local rank at once, on a worker thread (the
  loop never waits for a rank), answered when the slowest one answered or timed out;
* ``digest`` (a viewer of a big job, only where the Hello listed it): the catch-up with the
  rate rules' window of history, then one :class:`~ddptop.protocol.NodeDigest` per interval
  and the rare events at once (:mod:`ddptop.agent.digest`). Nothing of it is done while no
  viewer asked for it.

``state`` / ``history`` / ``digest`` with ``Request.ranks`` answer for those ranks only.

Threads: the agent's threads call :meth:`publish`; one loop thread owns the sockets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Protocol

from ddptop.agent.digest import CATCHUP_SAMPLES, DIGEST_S, DigestBuilder
from ddptop.net.server import ReporterServer, Respond, ServerLoop
from ddptop.protocol import (
    AGENT_HELLO_RANK,
    DIGEST_FEATURE,
    AgentBeat,
    AgentReply,
    ErrorMsg,
    Event,
    Message,
    Request,
)

log = logging.getLogger(__name__)

Published = Event | AgentBeat

MAX_QUEUED = 50_000  # events waiting for the loop thread; beyond it the oldest are dropped
SLOW_WORKERS = 2  # stacks / fr_trace requests asked of the ranks at once
FLUSH_AT_CLOSE_S = 1.0
# Peers of the node's endpoint: viewers, and every other node agent of the job (their news
# exchange), which connect at about the same moment. Each peer's output is capped, and all
# of them together by the server's total.
MAX_PEERS = 8192
MAX_HANDSHAKING = 256
ASK_TIMEOUT_S = 4.0  # under a viewer's 5 s: the agent answers before the viewer gives up
# An agent forwards every rank of its host: more room per viewer than one rank's server.
MAX_VIEWER_OUTPUT = 32 * 1024 * 1024


class NodeAnswers(Protocol):
    """What the node's endpoint asks the agent for: the agent's own answers
    (:class:`~ddptop.agent.service.NodeService`), or a stand-in's. Called on the endpoint's
    loop thread (``ask`` on a worker thread): each takes the agent's lock itself."""

    def catch_up(self, ranks: set[int] | None, samples: int | None) -> list[Event]:
        """Everything known about each local rank of *ranks* (None: all) now, histories cut to
        their last *samples* (None: whole): what a viewer that connects gets first."""
        ...

    def ask(self, command: str, timeout: float) -> list[Event]:
        """Stacks or FR dumps (*command*) of every local rank that still runs."""
        ...

    def news(self) -> list[Event]:
        """This node's news so far, for another node's agent that connects now."""
        ...

    def now(self) -> float:
        """The agent's wall clock, which need not be the viewer's."""
        ...


class NodeEndpoint:
    """Serves one job's local ranks to viewers until :meth:`close`."""

    def __init__(self, bind: str, port: int, token: str | None, job_id: str, answers: NodeAnswers,
                 host: str = "", digest_s: float = DIGEST_S) -> None:
        self._agent = answers  # what the agent knows, asked on demand
        self._digest = DigestBuilder(host)  # the loop thread's alone
        self._digest_s = digest_s
        self._next_digest = time.monotonic() + digest_s
        self._loop = ServerLoop(wakeable=True)
        try:
            self.server = ReporterServer(bind, port, token, AGENT_HELLO_RANK, job_id, self._handle,
                                         loop=self._loop, max_output=MAX_VIEWER_OUTPUT, role="agent",
                                         deferrer=self._defer, max_clients=MAX_PEERS,
                                         max_pending=MAX_HANDSHAKING, features=[DIGEST_FEATURE])
        except OSError:
            self._loop.close()
            raise
        self.port = self.server.port
        self.dropped = 0  # events not forwarded: the loop thread fell this far behind
        self._lock = threading.Lock()
        self._events: deque[tuple[Published, bool]] = deque()
        self._replies: deque[tuple[Respond, Message]] = deque()
        self._slow = threading.BoundedSemaphore(SLOW_WORKERS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddptop-endpoint", daemon=True)
        self._thread.start()

    def publish(self, event: Published, news: bool = False) -> None:
        """Forward *event* to every subscribed viewer, and with *news* to the other agents
        (any thread; never blocks)."""
        with self._lock:
            if len(self._events) >= MAX_QUEUED:
                self._events.popleft()
                self.dropped += 1
            self._events.append((event, news))
        self._loop.wake()

    def close(self) -> None:
        """Stop serving: close every viewer's connection and the listener."""
        self._stop.set()
        self._loop.wake()
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            self._drain(FLUSH_AT_CLOSE_S)
            self.server.close()
            self._loop.close()

    def _drain(self, limit_s: float) -> None:
        """Send what is queued (the agent's closing beat, its ranks' last exits) before the
        sockets close: bounded, a viewer that does not read is not waited for."""
        with self._lock:
            events, self._events = self._events, deque()
        for event, news in events:
            self._send(event, news)
        deadline = time.monotonic() + limit_s
        while self.server.queued_bytes and time.monotonic() < deadline:
            self._loop.poll(0.02)

    # ------------------------------------------------------------ the loop thread

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._loop.poll(min(0.5, max(0.0, self._next_digest - time.monotonic())))
                with self._lock:
                    events, self._events = self._events, deque()
                    replies, self._replies = self._replies, deque()
                for event, news in events:
                    self._send(event, news)
                for respond, reply in replies:
                    respond(reply)
                if time.monotonic() >= self._next_digest:
                    # A wide job's digest spans more than one sample interval (agent/digest.py).
                    span_s = self._digest_s * self._digest.span
                    self._next_digest = max(self._next_digest + span_s, time.monotonic())
                    if self.server.digest_peers:
                        digest = self._digest.flush(self._agent.now(), self.dropped)
                        self.server.broadcast(digest, digest=True)
            except Exception as exc:  # a viewer must never take the agent down
                log.warning("ddptop agent endpoint: %s", exc)
                self._stop.wait(0.1)

    def _send(self, event: Published, news: bool) -> None:
        """One published event out: the node's own (not news) also feeds the digest lane while
        a digest viewer is connected, and goes to it at once if rare (one encoding for all)."""
        if news or isinstance(event, AgentBeat) or not self.server.digest_peers:
            if not self.server.digest_peers:
                self._digest.reset()
            self.server.broadcast(event, news=news)
            return
        self.server.broadcast(event, digest=self._digest.add(event))

    def _handle(self, request: Request) -> Message:
        # On the loop thread: what the agent already knows, at once (to subscribe, the
        # stream that follows is the answer).
        ranks = set(request.ranks) if request.ranks else None
        if request.command in ("history", "state"):
            entries = self._agent.catch_up(ranks, None)
        elif request.command == "digest":  # the peer is marked: the lane starts after this reply
            entries = self._agent.catch_up(ranks, CATCHUP_SAMPLES)
            self._digest.seed(entries)
        elif request.command == "news":
            entries = self._agent.news()
        else:  # "ping" (a viewer asks whether this agent is there: client/reachability.py), or unknown
            entries = []
        return AgentReply(time=self._agent.now(), entries=entries, id=request.id)

    def _defer(self, request: Request, respond: Respond) -> bool:
        if request.command not in ("stacks", "fr_trace"):
            return False
        if not self._slow.acquire(blocking=False):
            respond(ErrorMsg(reason=f"{request.command}: the agent is busy with earlier requests",
                             id=request.id))
            return True
        threading.Thread(target=self._ask_ranks, args=(request, respond), name="ddptop-endpoint-ask",
                         daemon=True).start()
        return True

    def _ask_ranks(self, request: Request, respond: Respond) -> None:
        try:
            entries = self._agent.ask(request.command, ASK_TIMEOUT_S)
            reply: Message = AgentReply(time=self._agent.now(), entries=entries, id=request.id)
        except Exception as exc:
            reply = ErrorMsg(reason=f"{request.command} failed: {exc}", id=request.id)
        finally:
            self._slow.release()
        # The reply's own id is what the viewer matches; the entries stay as the model holds
        # them (a stuck rank's stacks are shared with it and must not be written to here).
        with self._lock:
            self._replies.append((respond, reply))
        self._loop.wake()

