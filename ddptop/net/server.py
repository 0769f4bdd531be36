"""ddptop's TCP server, a rank's and (role "agent") the node agent's: a loop that never blocks.

Each connection starts with both sides sending the stream header; the rank then sends
``Hello`` (with a nonce when a token is required), and a viewer may send only the fixed,
read-only ``Request`` commands. Sockets are non-blocking and every peer is bounded in
output, request rate, time and number (:mod:`ddptop.net.limits`): a viewer too slow
to read loses state frames, a peer that asks without reading stops being read, and
everything refused is counted. A peer that sends garbage, an oversized frame or a wrong
version is dropped with one log line; nobody else is affected.

:class:`ReporterServer` is what is said over the connections (the Hello, the token's proof,
requests and broadcasts); the connections themselves, and the limits that hold whatever a
peer says, are its base :class:`~ddptop.net.peers.PeerServer`'s. A ``ServerLoop`` (one
selector) drives any number of servers: a rank's server makes its own, the synthetic job
(``ddptop.testing.synthetic``) shares one among thousands of fake ranks, and the node agent's
endpoint (:mod:`ddptop.agent.endpoint`) serves with the same class, so ranks, fakes and agents
share one protocol, one auth and one set of limits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ddptop import auth
from ddptop.errors import ProtocolError
from ddptop.net import limits, stream
from ddptop.net.limits import MAX_CLIENT_OUTPUT, MAX_REQUEST_BYTES, Peer
from ddptop.net.loop import ServerLoop
from ddptop.net.peers import PeerServer
from ddptop.protocol import (
    COMMANDS,
    PROTOCOL_VERSION,
    AgentBeat,
    AuthProof,
    AuthResult,
    ErrorMsg,
    Hello,
    Message,
    NodeDigest,
    ReporterStats,
    Request,
)
from ddptop.wire import encode_frame, header_bytes

__all__ = ["MAX_CLIENT_OUTPUT", "MAX_REQUEST_BYTES", "ReporterServer", "ServerLoop"]

log = logging.getLogger(__name__)

Handler = Callable[[Request], Message]
Respond = Callable[[Message], None]
# Takes a request that cannot be answered at once (a node agent asks its ranks): True when
# it did; it then calls the Respond it got, later, on the loop's thread (never from another).
Deferrer = Callable[[Request, Respond], bool]


class ReporterServer(PeerServer):
    """Accepts viewers of one rank and answers their requests through *handler*.

    Without *loop* the server makes and owns a private :class:`ServerLoop`; with one, many
    servers share it and whoever drives the loop serves them all. *max_output* overrides
    the per-viewer cap on pushed state frames. A node agent serves with *role* "agent"
    and answers slow requests through *deferrer*.
    """

    def __init__(self, host: str, port: int, token: str | None, rank: int, job_id: str,
                 handler: Handler, *, loop: ServerLoop | None = None, max_output: int | None = None,
                 role: str = "rank", deferrer: Deferrer | None = None,
                 max_clients: int | None = None, max_pending: int | None = None,
                 features: list[str] | None = None) -> None:
        super().__init__(host, port, rank, loop, max_clients, max_pending)
        self._token = token
        self._job_id = job_id
        self._handler = handler
        self._role = role
        self._features = list(features or [])  # in the Hello: what a peer may ask beyond COMMANDS' core
        self._deferrer = deferrer
        self._max_output = max_output

    @property
    def subscribers(self) -> int:
        """Viewers that asked for a state stream."""
        return sum(1 for c in self._clients if c.subscribed)

    @property
    def digest_peers(self) -> int:
        """Viewers that asked a node agent for its digest lane."""
        return sum(1 for c in self._clients if c.digest)

    def fill_stats(self, stats: ReporterStats) -> None:
        """Copy what this server dropped and refused into the rank's reporter stats."""
        stats.clients = len(self._clients)
        self.counters.fill(stats)

    def broadcast(self, message: Message, news: bool = False, digest: bool = False) -> None:
        """Queue *message* (encoded once) for every subscribed, authenticated viewer; with *news*
        / *digest*, also (or, for an agent's beat / a NodeDigest, only: a subscribed viewer may
        not know the tag) for the peers that asked for "news" / "digest"."""
        lane_only = isinstance(message, AgentBeat | NodeDigest)
        if not any(c.wants(lane_only, news, digest) for c in self._clients):
            return
        frame = encode_frame(message)
        cap = self._max_output if self._max_output is not None else limits.MAX_CLIENT_OUTPUT
        for client in list(self._clients):
            if client.wants(lane_only, news, digest) and client.authed:
                if (len(client.out) + len(frame) > cap
                        or self._queued + len(frame) > limits.MAX_TOTAL_OUTPUT):
                    self.counters.dropped_frames += 1
                    continue
                self._queue(client, frame)

    # ---------------------------------------------------------------- input

    def _greet(self, client: Peer) -> None:
        """The stream header and the Hello (with a nonce to prove the token against, if any)."""
        hello = Hello(protocol=PROTOCOL_VERSION, role=self._role, rank=self._rank, job_id=self._job_id,
                      features=self._features)
        if self._token:
            client.nonce = auth.new_nonce()
            hello.nonce, hello.auth_required = client.nonce, True
        else:
            client.authed = True
        self._queue(client, header_bytes() + encode_frame(hello))

    def _read(self, client: Peer) -> None:
        try:
            got = stream.receive(client.sock, client.inbuf, limits.RECV_BYTES)
        except OSError as exc:
            self._drop(client, f"read error: {exc}")
            return
        except ProtocolError as exc:
            self.counters.rejected_peers += 1
            self._drop(client, str(exc))
            return
        if got is None:
            self._drop(client, None)
            return
        messages = got.messages
        if not client.admitted and client.authed and client.inbuf.header_seen:
            self._admit(client)  # no token: the header completes the handshake
        now = time.monotonic()
        for message in messages:
            if client not in self._clients:
                return
            if client.throttled_until:
                self.counters.rate_limited += 1  # the rest of a flood: refused unanswered
            else:
                self._dispatch(client, message, now)
        if client in self._clients:
            self._update_events(client)

    def _dispatch(self, client: Peer, message: Message, now: float) -> None:
        if not client.authed:
            if isinstance(message, AuthProof) and self._token and auth.verify(
                self._token, client.nonce, message.mac
            ):
                client.authed = True
                mine = auth.prove_server(self._token, message.nonce) if message.nonce else ""
                self._queue(client, encode_frame(AuthResult(ok=True, mac=mine)))
                if client.inbuf.header_seen:
                    self._admit(client)
                return
            self.counters.rejected_peers += 1
            self._queue(client, encode_frame(AuthResult(ok=False, reason="bad token")))
            self._flush(client)
            self._drop(client, "authentication failed")
            return
        ident = getattr(message, "id", 0)
        client.last_request = now
        if not client.bucket.take(now):
            # Over the rate: one refusal tells a real viewer why; the peer's requests then
            # go unread for one refill period, so TCP pushes back on a flood.
            self.counters.rate_limited += 1
            client.throttled_until = now + 1.0 / limits.REQUEST_RATE
            self._reply(client, ErrorMsg(reason="rate limited: too many requests", id=ident))
            return
        if not isinstance(message, Request) or message.command not in COMMANDS:
            what = message.command if isinstance(message, Request) else type(message).__name__
            # The request's id lets a viewer match the refusal to what it asked.
            self._reply(client, ErrorMsg(reason=f"unsupported request {what!r}", id=ident))
            return
        if message.command == "subscribe":
            client.subscribed = True
        elif message.command == "news" and self._role == "agent":
            client.news = True
        elif message.command == "digest" and self._role == "agent":  # a rank's handler refuses it
            client.digest = True
        elif message.command == "unsubscribe":
            client.subscribed = False
            return
        if len(client.out) >= limits.MAX_REPLY_OUTPUT:
            self.counters.dropped_replies += 1  # not even worth computing
            return
        if self._deferrer is not None and self._deferrer(message, lambda m: self._reply_if_here(client, m)):
            return
        try:
            reply = self._handler(message)
        except Exception as exc:  # a failing request must not kill the server
            log.warning("ddptop: request %s failed: %s", message.command, exc)
            reply = ErrorMsg(reason=f"{message.command} failed: {exc}", id=message.id)
        self._reply(client, reply)

    # ---------------------------------------------------------------- output

    def _reply(self, client: Peer, reply: Message) -> None:
        """Queue an answer unless the peer's unread output (or everyone's) is over its cap."""
        try:
            frame = encode_frame(reply)
        except ProtocolError as exc:
            frame = encode_frame(ErrorMsg(reason=str(exc), id=getattr(reply, "id", 0)))
        if (len(client.out) >= limits.MAX_REPLY_OUTPUT
                or self._queued + len(frame) > limits.MAX_TOTAL_OUTPUT):
            self.counters.dropped_replies += 1
            return
        self._queue(client, frame)

    def _reply_if_here(self, client: Peer, reply: Message) -> None:
        if client in self._clients:  # a deferred answer to a peer that left is dropped
            self._reply(client, reply)
