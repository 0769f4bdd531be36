"""ddptop's TCP server, a rank's and (role "agent") the node agent's: a loop that never blocks.

Each connection starts with both sides sending the stream header; the rank then sends
``Hello`` (with a nonce when a token is required), and a viewer may send only the fixed,
read-only ``Request`` commands. Sockets are non-blocking and every peer is bounded in
output, request rate, time and number (:mod:`ddptop.net.limits`): a viewer too slow
to read loses state frames, a peer that asks without reading stops being read, and
everything refused is counted. A peer that sends garbage, an oversized frame or a wrong
version is dropped with one log line; nobody else is affected.

A ``ServerLoop`` (one selector) drives any number of servers: a rank's server makes its
own, the synthetic job (``ddptop.testing.synthetic``) shares one among thousands of fake ranks,
so the protocol, auth and limits exist only here.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable

from ddptop import auth
from ddptop.errors import ProtocolError
from ddptop.net import limits, stream
from ddptop.net.limits import MAX_CLIENT_OUTPUT, MAX_REQUEST_BYTES, Peer, ServerCounters, TokenBucket
from ddptop.net.loop import ServerLoop
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
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE

class ReporterServer:
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
        self._owns_loop = loop is None
        # A node agent is also a peer of every other node agent of its job: more room. (None:
        # the limits module's, read when used.)
        self._max_clients, self._max_pending = max_clients, max_pending
        # A private loop is wakeable: the rank's exit should not wait out a poll timeout.
        self._loop = loop if loop is not None else ServerLoop(wakeable=True)
        self._listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            # A deep backlog: with a shallow one, peers that connect and linger fill it and
            # a real viewer's SYN is dropped (then retried after 1 s, 3 s...).
            self._listener.listen(limits.LISTEN_BACKLOG)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            if self._owns_loop:
                self._loop.close()
            raise
        self._loop.selector.register(self._listener, selectors.EVENT_READ, self)
        self._loop.servers.append(self)
        self.port = int(self._listener.getsockname()[1])
        self._token = token
        self._rank = rank
        self._job_id = job_id
        self._handler = handler
        self._role = role
        self._features = list(features or [])  # in the Hello: what a peer may ask beyond COMMANDS' core
        self._deferrer = deferrer
        self._max_output = max_output
        self._clients: set[Peer] = set()
        # Insertion-ordered: the oldest handshaking peer is evicted first.
        self._pending: dict[Peer, None] = {}
        self._queued = 0  # bytes in every client's output, together
        self.counters = ServerCounters()

    @property
    def client_count(self) -> int:
        """Connected peers (viewers and those still in the handshake)."""
        return len(self._clients)

    @property
    def subscribers(self) -> int:
        """Viewers that asked for a state stream."""
        return sum(1 for c in self._clients if c.subscribed)

    @property
    def digest_peers(self) -> int:
        """Viewers that asked a node agent for its digest lane."""
        return sum(1 for c in self._clients if c.digest)

    @property
    def queued_bytes(self) -> int:
        """Output queued for peers and not yet sent."""
        return self._queued

    @property
    def buffered_bytes(self) -> int:
        """Bytes this server holds for its peers: queued output plus partial input."""
        return self._queued + sum(c.inbuf.pending_bytes for c in self._clients)

    def fill_stats(self, stats: ReporterStats) -> None:
        """Copy what this server dropped and refused into the rank's reporter stats."""
        stats.clients = len(self._clients)
        self.counters.fill(stats)

    def poll(self, timeout: float) -> None:
        """Serve sockets (of every server on this server's loop) for up to *timeout* seconds."""
        self._loop.poll(timeout)

    def wake(self) -> None:
        """End a :meth:`poll` in progress (from any thread) if the loop is wakeable."""
        self._loop.wake()

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

    def close(self) -> None:
        """Close this server's sockets (and its loop, if it made it)."""
        for client in list(self._clients):
            self._drop(client, None)
        self._loop.unregister(self._listener)
        self._listener.close()
        if self in self._loop.servers:
            self._loop.servers.remove(self)
        if self._owns_loop:
            self._loop.close()

    # ---------------------------------------------------------------- connections

    def _accept(self) -> None:
        for _ in range(limits.ACCEPTS_PER_WAKE):  # drain the backlog, boundedly
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # out of descriptors: refuse, never raise into the loop
                log.warning("ddptop rank %s: accept failed: %s", self._rank, exc)
                return
            self._admit_new(sock, addr)

    def _admit_new(self, sock: socket.socket, addr: tuple[str, int]) -> None:
        if len(self._pending) >= (self._max_pending or limits.MAX_PENDING):
            # Handshaking peers have their own small pool, oldest out first: silent
            # sockets cannot keep a newcomer (a real viewer finishes in milliseconds) out.
            oldest = next(iter(self._pending))
            self.counters.evicted_peers += 1
            self._drop(oldest, "evicted: too many connections in the handshake")
        self.adopt(sock, f"{addr[0]}:{addr[1]}")

    def adopt(self, sock: socket.socket, addr: str) -> None:
        """Serve an already connected peer socket as if it had just been accepted."""
        sock.setblocking(False)
        now = time.monotonic()
        client = Peer(owner=self, sock=sock, addr=addr, created=now,
                         bucket=TokenBucket(limits.REQUEST_RATE, limits.REQUEST_BURST, now),
                         last_request=now, last_drain=now)
        self._clients.add(client)
        self._pending[client] = None
        self._loop.selector.register(sock, _READ, client)
        hello = Hello(protocol=PROTOCOL_VERSION, role=self._role, rank=self._rank, job_id=self._job_id,
                      features=self._features)
        if self._token:
            client.nonce = auth.new_nonce()
            hello.nonce, hello.auth_required = client.nonce, True
        else:
            client.authed = True
        self._queue(client, header_bytes() + encode_frame(hello))

    def _admit(self, client: Peer) -> None:
        """The handshake is complete: move *client* from the pending pool to the viewers."""
        self._pending.pop(client, None)
        client.admitted = True
        viewers = [c for c in self._clients if c.admitted and c is not client]
        if len(viewers) >= (self._max_clients or limits.MAX_CLIENTS):
            # Never lock a real viewer out: make room by closing the viewer that has been
            # quiet the longest, preferring one that is not subscribed and reading.
            quietest = min(viewers, key=lambda c: (c.streaming and not c.out, c.last_request))
            self.counters.evicted_peers += 1
            self._drop(quietest, "evicted: too many viewers")

    def sweep(self, now: float) -> None:
        """Close peers that overstay a time limit; resume peers whose throttle expired."""
        for client in list(self._clients):
            reason = ""
            if not client.admitted and now - client.created > limits.HANDSHAKE_TIMEOUT_S:
                reason = "handshake not completed in time"
            elif client.out and now - client.last_drain > limits.STALL_TIMEOUT_S:
                reason = "not reading its output"
            elif not client.streaming and now - client.last_request > limits.IDLE_TIMEOUT_S:
                reason = "idle"
            if reason:
                self.counters.timed_out_peers += 1
                self._drop(client, reason)
            elif client.throttled_until and now >= client.throttled_until:
                client.throttled_until = 0.0
                self._update_events(client)

    # ---------------------------------------------------------------- input

    def on_ready(self, events: int) -> None:
        """The listener is readable: accept a peer."""
        self._accept()

    def serve_peer(self, client: Peer, events: int) -> None:
        """The selector saw *events* on *client*'s socket."""
        if events & _READ and not client.throttled_until:
            self._read(client)
        if events & _WRITE and client in self._clients:
            self._flush(client)

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

    def _queue(self, client: Peer, frame: bytes) -> None:
        if not client.out:
            client.last_drain = time.monotonic()
        client.out += frame
        self._queued += len(frame)
        self._flush(client)

    def _flush(self, client: Peer) -> None:
        try:
            sent = stream.send_queued(client.sock, client.out)
        except OSError as exc:
            self._drop(client, f"write error: {exc}")
            return
        self.counters.bytes_out += sent
        self._queued -= sent
        if sent:
            client.last_drain = time.monotonic()
        self._update_events(client)

    def _update_events(self, client: Peer) -> None:
        """Watch for writes while output is queued; stop reading while it is over the mark."""
        paused = len(client.out) > limits.PAUSE_READ_BYTES or bool(client.throttled_until)
        events = (0 if paused else _READ) | (_WRITE if client.out else 0)
        if events == client.events:
            return  # saves an epoll_ctl per frame: the common case, thousands of frames/s in synthetic
        if events & _READ == 0 and client.events & _READ and not client.throttled_until:
            self.counters.read_pauses += 1
        client.events = events
        try:
            if events:
                self._loop.selector.modify(client.sock, events, client)
            else:
                self._loop.unregister(client.sock)
        except (KeyError, ValueError):
            if events:  # unregistered while idle-throttled: watch it again
                try:
                    self._loop.selector.register(client.sock, events, client)
                except (KeyError, ValueError, OSError):
                    pass

    def _drop(self, client: Peer, reason: str | None) -> None:
        if reason:
            log.warning("ddptop rank %s: dropped viewer %s: %s", self._rank, client.addr, reason)
        if client not in self._clients:
            return
        self._clients.discard(client)
        self._pending.pop(client, None)
        self._queued -= len(client.out)
        client.out.clear()
        self._loop.unregister(client.sock)
        client.sock.close()
