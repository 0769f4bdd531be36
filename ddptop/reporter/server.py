"""The rank's TCP server: a selector loop that never blocks the reporter thread.

Each connection starts with both sides sending the stream header; the rank then sends
``Hello`` (with a nonce when a token is required), and a viewer may send only the fixed,
read-only ``Request`` commands. Sockets are non-blocking and each client's output is
capped: a viewer too slow to read loses state frames (counted as dropped), it never
stalls the rank. A peer that sends garbage, an oversized frame or a wrong version is
dropped with one log line; nobody else is affected.

A ``ServerLoop`` (one selector) drives any number of servers: a rank's server makes its
own, the synthetic job (``ddptop.synthetic``) shares one among thousands of fake ranks,
so the protocol, auth and output cap exist only here.
"""

from __future__ import annotations

import logging
import selectors
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from ddptop import auth
from ddptop.errors import ProtocolError
from ddptop.protocol import (
    COMMANDS,
    PROTOCOL_VERSION,
    AuthProof,
    AuthResult,
    ErrorMsg,
    Hello,
    Message,
    Request,
)
from ddptop.wire import FrameBuffer, encode_frame, header_bytes

log = logging.getLogger(__name__)

MAX_CLIENT_OUTPUT = 8 * 1024 * 1024  # beyond this a slow viewer loses frames
MAX_REQUEST_BYTES = 64 * 1024  # viewers only send small commands
MAX_CLIENTS = 64

Handler = Callable[[Request], Message]


class ServerLoop:
    """One selector driving the listeners and viewers of any number of :class:`ReporterServer`.

    A rank owns one server and lets it make a private loop; the synthetic job puts thousands
    of servers on one loop, since a selector per rank (an epoll fd and a poll call each)
    does not scale to 4096 ranks in one thread.
    """

    def __init__(self, wakeable: bool = False) -> None:
        self.selector = selectors.DefaultSelector()
        # A loop polled by a thread that must stop promptly (a rank's reporter at exit, the
        # synthetic job) needs waking; shared loops driven inline do not pay for the pair.
        self._wake: tuple[socket.socket, socket.socket] | None = None
        if wakeable:
            self._wake = socket.socketpair()
            self._wake[0].setblocking(False)
            self.selector.register(self._wake[0], selectors.EVENT_READ, None)

    def poll(self, timeout: float) -> None:
        """Serve every registered socket for up to *timeout* seconds."""
        for key, events in self.selector.select(timeout):
            owner = key.data
            if isinstance(owner, _Client):
                owner.server._serve(owner, events)
            elif isinstance(owner, ReporterServer):
                owner._accept()
            elif self._wake is not None:
                try:
                    self._wake[0].recv(4096)
                except OSError:
                    pass

    def wake(self) -> None:
        """Interrupt a :meth:`poll` running in another thread (needs ``wakeable=True``)."""
        if self._wake is not None:
            try:
                self._wake[1].send(b"x")
            except OSError:
                pass

    def unregister(self, sock: socket.socket) -> None:
        """Forget *sock* (already forgotten or closed is fine)."""
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def close(self) -> None:
        """Close the wake pair and the selector (the servers close their own sockets)."""
        for sock in self._wake or ():
            self.unregister(sock)
            sock.close()
        self.selector.close()


@dataclass(eq=False)
class _Client:
    server: ReporterServer
    sock: socket.socket
    addr: str
    inbuf: FrameBuffer = field(default_factory=lambda: FrameBuffer(limit=MAX_REQUEST_BYTES))
    out: bytearray = field(default_factory=bytearray)
    nonce: str = ""
    authed: bool = False
    subscribed: bool = False
    writing: bool = False  # registered for EVENT_WRITE


class ReporterServer:
    """Accepts viewers of one rank and answers their requests through *handler*.

    Without *loop* the server makes and owns a private :class:`ServerLoop`; with one, many
    servers share it and whoever drives the loop serves them all. *max_output* overrides
    the per-viewer output cap.
    """

    def __init__(self, host: str, port: int, token: str | None, rank: int, job_id: str,
                 handler: Handler, *, loop: ServerLoop | None = None, max_output: int | None = None) -> None:
        self._owns_loop = loop is None
        # A private loop is wakeable: the rank's exit should not wait out a poll timeout.
        self._loop = loop if loop is not None else ServerLoop(wakeable=True)
        self._listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(16)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            if self._owns_loop:
                self._loop.close()
            raise
        self._loop.selector.register(self._listener, selectors.EVENT_READ, self)
        self.port = int(self._listener.getsockname()[1])
        self._token = token
        self._rank = rank
        self._job_id = job_id
        self._handler = handler
        self._max_output = max_output
        self._clients: set[_Client] = set()
        self.dropped_frames = 0
        self.rejected_peers = 0

    @property
    def client_count(self) -> int:
        """Connected viewers."""
        return len(self._clients)

    @property
    def subscribers(self) -> int:
        """Viewers that asked for a state stream."""
        return sum(1 for c in self._clients if c.subscribed)

    def poll(self, timeout: float) -> None:
        """Serve sockets (of every server on this server's loop) for up to *timeout* seconds."""
        self._loop.poll(timeout)

    def wake(self) -> None:
        """End a :meth:`poll` in progress (from any thread) if the loop is wakeable."""
        self._loop.wake()

    def broadcast(self, message: Message) -> None:
        """Queue *message* (encoded once) for every subscribed, authenticated viewer."""
        if not any(c.subscribed for c in self._clients):
            return
        frame = encode_frame(message)
        for client in list(self._clients):
            if client.subscribed and client.authed:
                self._send(client, frame, droppable=True)

    def close(self) -> None:
        """Close this server's sockets (and its loop, if it made it)."""
        for client in list(self._clients):
            self._drop(client, None)
        self._loop.unregister(self._listener)
        self._listener.close()
        if self._owns_loop:
            self._loop.close()

    # ---------------------------------------------------------------- internals

    def _accept(self) -> None:
        try:
            sock, addr = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        if len(self._clients) >= MAX_CLIENTS:
            sock.close()
            self.rejected_peers += 1
            return
        sock.setblocking(False)
        client = _Client(server=self, sock=sock, addr=f"{addr[0]}:{addr[1]}")
        self._clients.add(client)
        self._loop.selector.register(sock, selectors.EVENT_READ, client)
        hello = Hello(protocol=PROTOCOL_VERSION, role="rank", rank=self._rank, job_id=self._job_id)
        if self._token:
            client.nonce = auth.new_nonce()
            hello.nonce, hello.auth_required = client.nonce, True
        else:
            client.authed = True
        self._send(client, header_bytes() + encode_frame(hello), droppable=False)

    def _serve(self, client: _Client, events: int) -> None:
        if events & selectors.EVENT_READ:
            self._read(client)
        if events & selectors.EVENT_WRITE and client in self._clients:
            self._flush(client)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(client, f"read error: {exc}")
            return
        if not data:
            self._drop(client, None)
            return
        try:
            messages = client.inbuf.feed(data)
        except ProtocolError as exc:
            self.rejected_peers += 1
            self._drop(client, str(exc))
            return
        for message in messages:
            if client not in self._clients:
                return
            self._dispatch(client, message)

    def _dispatch(self, client: _Client, message: Message) -> None:
        if not client.authed:
            if isinstance(message, AuthProof) and self._token and auth.verify(
                self._token, client.nonce, message.mac
            ):
                client.authed = True
                self._send(client, encode_frame(AuthResult(ok=True)), droppable=False)
                return
            self.rejected_peers += 1
            self._send(client, encode_frame(AuthResult(ok=False, reason="bad token")), droppable=False)
            self._flush(client)
            self._drop(client, "authentication failed")
            return
        if not isinstance(message, Request) or message.command not in COMMANDS:
            what = message.command if isinstance(message, Request) else type(message).__name__
            # The request's id lets a viewer match the refusal to what it asked.
            self._send(client, encode_frame(ErrorMsg(reason=f"unsupported request {what!r}",
                                                     id=getattr(message, "id", 0))), droppable=False)
            return
        if message.command == "subscribe":
            client.subscribed = True
        elif message.command == "unsubscribe":
            client.subscribed = False
            return
        try:
            reply = self._handler(message)
        except Exception as exc:  # a failing request must not kill the server
            log.warning("ddptop: request %s failed: %s", message.command, exc)
            reply = ErrorMsg(reason=f"{message.command} failed: {exc}", id=message.id)
        try:
            frame = encode_frame(reply)
        except ProtocolError as exc:
            frame = encode_frame(ErrorMsg(reason=str(exc), id=message.id))
        self._send(client, frame, droppable=False)

    def _send(self, client: _Client, frame: bytes, droppable: bool) -> None:
        cap = self._max_output if self._max_output is not None else MAX_CLIENT_OUTPUT
        if droppable and len(client.out) + len(frame) > cap:
            self.dropped_frames += 1
            return
        client.out += frame
        self._flush(client)

    def _flush(self, client: _Client) -> None:
        while client.out:
            try:
                sent = client.sock.send(client.out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._drop(client, f"write error: {exc}")
                return
            del client.out[:sent]
        want = bool(client.out)
        if want == client.writing:
            return  # saves an epoll_ctl per frame: the common case, thousands of frames/s in synthetic
        client.writing = want
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
        try:
            self._loop.selector.modify(client.sock, events, client)
        except (KeyError, ValueError):
            pass

    def _drop(self, client: _Client, reason: str | None) -> None:
        if reason:
            log.warning("ddptop rank %s: dropped viewer %s: %s", self._rank, client.addr, reason)
        self._clients.discard(client)
        self._loop.unregister(client.sock)
        client.sock.close()
