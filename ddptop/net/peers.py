"""The peers of one listening socket, each bounded: a server's half below its protocol.

:class:`PeerServer` accepts connections on a :class:`~ddptop.net.loop.ServerLoop` and keeps
them within the limits of :mod:`ddptop.net.limits` that do not depend on what a peer says:
how many may be in the handshake and how many viewers (evicting the oldest, the quietest),
how long each may take or stay quiet (:meth:`PeerServer.sweep`), and each one's queued
output (written as the socket takes it; its requests unread while it is over the mark).
What is said over them, the handshake's Hello and token proof and every request, is
:class:`~ddptop.net.server.ReporterServer`'s.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time

from ddptop.net import limits, stream
from ddptop.net.limits import Peer, ServerCounters, TokenBucket
from ddptop.net.loop import ServerLoop

log = logging.getLogger(__name__)

_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


class PeerServer:
    """A listening socket on *host*:*port* and its peers, served on *loop* (without one, a
    private loop this server owns). *rank* names the server in log lines. Subclasses greet a
    new peer (:meth:`_greet`) and read what it sends (:meth:`_read`)."""

    def __init__(self, host: str, port: int, rank: int, loop: ServerLoop | None,
                 max_clients: int | None, max_pending: int | None) -> None:
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
        self._rank = rank
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
    def queued_bytes(self) -> int:
        """Output queued for peers and not yet sent."""
        return self._queued

    @property
    def buffered_bytes(self) -> int:
        """Bytes this server holds for its peers: queued output plus partial input."""
        return self._queued + sum(c.inbuf.pending_bytes for c in self._clients)

    def poll(self, timeout: float) -> None:
        """Serve sockets (of every server on this server's loop) for up to *timeout* seconds."""
        self._loop.poll(timeout)

    def wake(self) -> None:
        """End a :meth:`poll` in progress (from any thread) if the loop is wakeable."""
        self._loop.wake()

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

    def _greet(self, client: Peer) -> None:
        """Open the handshake with a peer just adopted (the subclass's protocol)."""
        raise NotImplementedError

    def _read(self, client: Peer) -> None:
        """Read and answer what *client* sent (the subclass's protocol)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- connections

    def on_ready(self, events: int) -> None:
        """The listener is readable: accept a peer."""
        self._accept()

    def serve_peer(self, client: Peer, events: int) -> None:
        """The selector saw *events* on *client*'s socket."""
        if events & _READ and not client.throttled_until:
            self._read(client)
        if events & _WRITE and client in self._clients:
            self._flush(client)

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
        self._greet(client)

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

    # ---------------------------------------------------------------- output

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
