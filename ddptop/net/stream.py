"""Frames over one non-blocking socket: the read half and the write half every peer shares.

A rank's server (:mod:`ddptop.net.server`), the node agent's endpoint (made of one) and the
viewer's live source (:mod:`ddptop.client.live`) all move their bytes through these two
functions on a :class:`~ddptop.net.loop.ServerLoop`, so "would block", "closed" and "failed"
mean the same thing on both ends of a connection. What to do about a failure (drop a viewer,
call a rank lost) stays with the owner, which knows what the peer was.
"""

from __future__ import annotations

import socket
from typing import NamedTuple

from ddptop.protocol import Message
from ddptop.wire import FrameBuffer


class Received(NamedTuple):
    """What one read brought: the whole frames it completed, and how many bytes it read."""

    messages: list[Message]
    nbytes: int


NOTHING = Received([], 0)


def send_queued(sock: socket.socket, out: bytearray) -> int:
    """Send as much of *out* as the socket takes now and remove it from *out*.

    Returns the bytes sent (0 when the socket's buffer is full: try again when it is
    writable). Raises ``OSError`` when the connection failed.
    """
    total = 0
    while out:
        try:
            sent = sock.send(out)
        except (BlockingIOError, InterruptedError):
            break
        if not sent:
            break
        del out[:sent]
        total += sent
    return total


def receive(sock: socket.socket, inbuf: FrameBuffer, max_bytes: int) -> Received | None:
    """Read what is there (at most *max_bytes*) and the frames it completes.

    ``NOTHING`` when no byte was ready, ``None`` when the peer closed the connection.
    Raises ``OSError`` when the connection failed and ``ProtocolError`` (from the frame
    buffer: garbage, an oversized frame, a wrong version) when the peer broke the protocol.
    """
    try:
        data = sock.recv(max_bytes)
    except (BlockingIOError, InterruptedError):
        return NOTHING
    if not data:
        return None
    return Received(inbuf.feed(data), len(data))
