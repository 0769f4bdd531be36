"""A viewer's connection to one rank: handshake, token proof, requests, a state stream.

Blocking sockets with timeouts, meant to be driven from worker threads (never the UI
thread). Every failure is a :class:`ProtocolError` / :class:`AuthError` /
:class:`RankUnreachable` with a one-line reason.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import TypeVar

from ddptop.client.handshake import Handshake
from ddptop.errors import AuthError, ProtocolError, RankUnreachable
from ddptop.protocol import (
    AuthResult,
    ErrorMsg,
    FrTraceMsg,
    Hello,
    Message,
    Request,
    StacksMsg,
    StateMsg,
)
from ddptop.store.discovery import Endpoint
from ddptop.wire import FrameBuffer, encode_frame, header_bytes

T = TypeVar("T")


class RankConnection:
    """One TCP connection to a rank's reporter (*token*: see :class:`Handshake`)."""

    def __init__(self, endpoint: Endpoint, token: str | None = None, timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._handshake = Handshake(endpoint, token)
        self._sock: socket.socket | None = None
        self._buf = FrameBuffer()
        self._inbox: list[Message] = []
        self._next_id = 0
        self.hello: Hello | None = None

    def __enter__(self) -> RankConnection:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def label(self) -> str:
        """`rank N at host:port` (or `node agent at host:port`), for messages."""
        return self._handshake.label

    def open(self) -> Hello:
        """Connect, exchange headers, read Hello and prove the token if asked."""
        try:
            self._sock = socket.create_connection(
                (self.endpoint.host, self.endpoint.port), timeout=self.timeout
            )
            self._sock.settimeout(self.timeout)
            self._sock.sendall(header_bytes())
        except OSError as exc:
            raise RankUnreachable(f"{self.label}: {exc.strerror or exc}") from None
        hello = self._expect(Hello)
        self.hello = hello
        try:
            proof = self._handshake.on_hello(hello)
            if proof is not None:
                self._send(proof)
                self._handshake.on_result(self._expect(AuthResult))
        except AuthError:
            self.close()
            raise
        return hello

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    # ------------------------------------------------------------ requests

    def request(self, command: str, reply_type: type[T]) -> T:
        """Send *command* and wait for its reply of *reply_type*."""
        self._next_id += 1
        ident = self._next_id
        self._send(Request(command=command, id=ident))
        # Other messages (a subscribed state frame, a late reply) are kept for receive(),
        # in order; put back only once this reply is found, or receive() would hand the
        # same queued message back forever.
        deferred: list[Message] = []
        try:
            while True:
                message = self.receive()
                if isinstance(message, ErrorMsg) and message.id in (ident, 0):
                    raise ProtocolError(f"{self.label}: {message.reason}")
                if isinstance(message, reply_type) and getattr(message, "id", ident) == ident:
                    return message
                deferred.append(message)
        finally:
            self._inbox[:0] = deferred

    def state(self) -> StateMsg:
        """The rank's current state."""
        return self.request("state", StateMsg)

    def stacks(self) -> StacksMsg:
        """Every thread's Python stack, now."""
        return self.request("stacks", StacksMsg)

    def fr_trace(self) -> FrTraceMsg:
        """The Flight Recorder dump (JSON text)."""
        return self.request("fr_trace", FrTraceMsg)

    def subscribe(self) -> Iterator[Message]:
        """Ask for a state stream; yield every message the rank sends from now on."""
        self._send(Request(command="subscribe", id=0))
        while True:
            yield self.receive()

    # ------------------------------------------------------------ frames

    def receive(self) -> Message:
        """Next message from the rank (queued ones first)."""
        if self._inbox:
            return self._inbox.pop(0)
        while not self._inbox:
            if self._sock is None:
                raise RankUnreachable(f"{self.label}: connection closed")
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                raise RankUnreachable(f"{self.label}: no answer within {self.timeout:g} s") from None
            except OSError as exc:
                raise RankUnreachable(f"{self.label}: {exc.strerror or exc}") from None
            if not data:
                self.close()
                raise RankUnreachable(f"{self.label}: connection closed by the rank")
            self._inbox.extend(self._buf.feed(data))
        return self._inbox.pop(0)

    def _expect(self, kind: type[T]) -> T:
        message = self.receive()
        if not isinstance(message, kind):
            self.close()
            raise ProtocolError(f"{self.label}: expected {kind.__name__}, got {type(message).__name__}")
        return message

    def _send(self, message: Message) -> None:
        if self._sock is None:
            raise RankUnreachable(f"{self.label}: not connected")
        try:
            self._sock.sendall(encode_frame(message))
        except OSError as exc:
            raise RankUnreachable(f"{self.label}: {exc.strerror or exc}") from None
