"""A live source's node agents: what they send, whether they are still there, and the
delivery of events to the source's consumer.

:class:`AgentPeers` is the node-agent half of :class:`~ddptop.client.live.LiveSource`
(which sets up what it declares, and owns the sockets): one connection serves a few ranks
and sends their events ready-made (subscribed), as one digest per interval (the digest
lane, :mod:`ddptop.client.digest_view`), or, to another agent, as news. Its clock is not
ours (:class:`~ddptop.client.agents.ClockOffset`), and its silence with the connection open
is told apart from a close (:mod:`ddptop.client.reachability`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ddptop.client import agents, reachability
from ddptop.client.digest_view import DigestView
from ddptop.client.live_requests import LiveRequests, Peer
from ddptop.digest import PulseBatch
from ddptop.protocol import (
    DIGEST_FEATURE,
    EVENT_TYPES,
    AgentBeat,
    AgentReply,
    ErrorMsg,
    Event,
    Message,
    NodeDigest,
    Request,
)
from ddptop.source import Emit, PulseSink
from ddptop.store.discovery import Endpoint

log = logging.getLogger(__name__)


class AgentPeers(LiveRequests):
    """The node-agent connections of a live source, and delivery to its consumer."""

    on_agent: Callable[[Endpoint, AgentBeat | ErrorMsg], None] | None
    _news: bool  # ask agents for news only (the node agents' exchange)
    _digest: bool  # ask agents that offer it for the digest lane
    _agent_peers: list[Peer]
    _emit: Emit | None
    _pulses: PulseSink | None
    _stop: threading.Event
    _reach_check: float  # next look at the agents' silence

    # What the source itself does with its sockets.
    def _send(self, peer: Peer, message: Message) -> None:
        raise NotImplementedError

    def _close(self, peer: Peer, reason: str | None) -> None:
        raise NotImplementedError

    def _lost(self, peer: Peer, reason: str) -> None:
        raise NotImplementedError

    def _agent_ready(self, peer: Peer) -> None:
        """A node agent's handshake is done: ask for what this source follows."""
        if self._news:  # the catch-up of endings, then each new one
            self._send(peer, Request(command="news", id=0))
            return
        hello = peer.handshake.hello if peer.handshake is not None else None
        if self._digest and hello is not None and DIGEST_FEATURE in hello.features:
            peer.digest = DigestView()  # the catch-up first (whole states), then the lane
            self._send(peer, Request(command="digest", id=0))
            return
        # Subscribed first: nothing that happens after the catch-up is missed.
        self._send(peer, Request(command="subscribe", id=0))
        self._send(peer, Request(command="history", id=0))

    def _from_agent(self, peer: Peer, message: Message) -> None:
        """What a node agent sends: its ranks' events (on our clock), and replies."""
        for back in reachability.heard(peer, time.monotonic(), time.time()):
            self._deliver(back)
        ident = getattr(message, "id", 0)
        fut = peer.waiting.pop(ident, None) if ident else None
        if fut is not None and fut is peer.probe:
            fut.set_result(message)  # it answered the ping (an older agent: "unsupported"): it lives
            return
        if isinstance(message, AgentBeat | ErrorMsg) and self.on_agent is not None and fut is None:
            if isinstance(message, AgentBeat):
                peer.clock.observe(time.time(), message.time)
            self.on_agent(peer.endpoint, message)
        elif isinstance(message, NodeDigest):
            peer.clock.observe(time.time(), message.time)
            if peer.digest is not None:
                events, repair = peer.digest.expand(message, peer.clock.value)
                for event in events:
                    if not isinstance(event, PulseBatch):
                        self._deliver(event)
                    elif self._pulses is not None:
                        self._deliver_pulses(self._pulses, event)
                    else:  # a consumer that wants whole events (a recorder) gets states
                        for whole in event.entries():
                            self._deliver(whole)
                if repair:  # a digest or a detail went missing: fresh states replace the copies
                    self._send(peer, Request(command="state", ranks=repair, id=0))
        elif isinstance(message, AgentReply):
            peer.clock.observe(time.time(), message.time)
            for entry in agents.reply_entries(message, peer.clock.value):
                if peer.digest is not None:
                    peer.digest.whole(entry)
                self._deliver(entry)
        elif isinstance(message, EVENT_TYPES):
            if peer.digest is not None:
                peer.digest.whole(message)
            self._deliver(agents.shifted(message, peer.clock.value))
        if fut is not None:
            fut.set_result(message)

    def _deliver(self, event: Event) -> None:
        if self._emit is None or self._stop.is_set():
            return
        try:
            self._emit(event)
        except Exception as exc:  # a broken consumer must not kill the source
            log.warning("ddptop: event consumer failed: %s", exc)

    def _deliver_pulses(self, sink: PulseSink, batch: PulseBatch) -> None:
        if self._stop.is_set():
            return
        try:
            sink(batch)
        except Exception as exc:  # as _deliver: a broken consumer must not kill the source
            log.warning("ddptop: pulse consumer failed: %s", exc)

    def _probe(self, peer: Peer) -> None:
        """Ask a quiet node agent whether it is there (ddptop.client.reachability)."""
        with self._lock:
            peer.probe = self._ask(peer, "ping", peer.serves[0])

    def _failed(self, peer: Peer, exc: OSError) -> None:
        why = f"connection failed: {exc.strerror or exc}"
        if peer.serves and exc.errno in reachability.UNREACHABLE_ERRNOS:
            # No host answered (no route, a timeout): unreachable, which a closed connection is not.
            self._close(peer, why)
            if not self._stop.is_set() and not peer.unreachable:
                for event in reachability.unreachable_events(peer, time.time(), why):
                    self._deliver(event)
            return
        self._lost(peer, why)

    def _check_reach(self) -> None:
        """Probe the quiet agents, tell the ranks of the silent ones unreachable."""
        self._reach_check = time.monotonic() + reachability.CHECK_EVERY_S
        for event in reachability.check(self._agent_peers, time.monotonic(), time.time(), self._probe):
            self._deliver(event)
