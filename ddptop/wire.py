"""The versioned ddptop stream: a header, then length-prefixed msgpack frames.

One format for sockets and files alike (as in memray's live mode): a recording is a
socket stream written to disk, and replay is a file read as if it were a socket.

Layout::

    header  = MAGIC (6 bytes, b"DDPTOP") + version (u16 big-endian)
    frame   = length (u32 big-endian) + msgpack(Message)

A frame longer than ``MAX_FRAME_BYTES`` is refused before it is read, so a hostile
peer cannot make us allocate; a bad header or undecodable frame is a ProtocolError.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Generic, TypeVar

import msgspec

from ddptop.errors import ProtocolError
from ddptop.protocol import PROTOCOL_VERSION, Message

MAGIC = b"DDPTOP"
HEADER = struct.Struct(">6sH")
LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 16 * 1024 * 1024

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Message] = msgspec.msgpack.Decoder(Message)


def header_bytes(version: int = PROTOCOL_VERSION) -> bytes:
    """Return the stream header for protocol *version*."""
    return HEADER.pack(MAGIC, version)


def check_header(data: bytes) -> int:
    """Validate a stream header and return its version; ProtocolError if foreign."""
    if len(data) != HEADER.size:
        raise ProtocolError(f"stream ended inside the header ({len(data)} of {HEADER.size} bytes)")
    magic, version = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"not a ddptop stream (magic {magic!r})")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version} is not supported (this ddptop speaks {PROTOCOL_VERSION})"
        )
    return int(version)


def encode_frame(message: Message) -> bytes:
    """Encode *message* as one length-prefixed frame."""
    payload = _encoder.encode(message)
    if len(payload) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES} limit")
    return LENGTH.pack(len(payload)) + payload


def check_length(length: int, limit: int = MAX_FRAME_BYTES) -> None:
    """Refuse a frame length over *limit* before reading its payload."""
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes exceeds the {limit} limit")


class FrameParser(Generic[T]):
    """The one frame parser, for sockets and files: append bytes, take decoded frames.

    *decoder* turns a payload into a typed value (the wire's ``Message`` union for sockets,
    the bundle's ``Frame`` union for files). Frames are decoded one at a time, straight
    from the buffer, so a chunk of a million tiny frames never becomes a million-item
    list at once; bytes are dropped from the buffer once per batch.
    """

    def __init__(self, decoder: msgspec.msgpack.Decoder[T], expect_header: bool = True,
                 limit: int = MAX_FRAME_BYTES) -> None:
        self._decoder = decoder
        self._buf = bytearray()
        self._need_header = expect_header
        self._limit = limit
        self.decoded = 0  # frames decoded so far

    def append(self, data: bytes) -> None:
        """Add received bytes; ProtocolError as soon as a header is foreign."""
        self._buf += data
        if self._need_header:
            if len(self._buf) < HEADER.size:
                # A garbage peer is refused as soon as its first bytes disagree.
                if not MAGIC.startswith(bytes(self._buf[: len(MAGIC)])):
                    raise ProtocolError(f"not a ddptop stream (magic {bytes(self._buf[:16])!r})")
                return
            check_header(bytes(self._buf[: HEADER.size]))
            del self._buf[: HEADER.size]
            self._need_header = False

    def frames(self) -> Iterator[T]:
        """Decode and yield every complete frame now buffered (ProtocolError if one is bad)."""
        if self._need_header:
            return
        pos, buf = 0, self._buf
        try:
            while len(buf) - pos >= LENGTH.size:
                (length,) = LENGTH.unpack_from(buf, pos)
                check_length(length, self._limit)
                end = pos + LENGTH.size + length
                if len(buf) < end:
                    break
                with memoryview(buf) as view, view[pos + LENGTH.size : end] as payload:
                    try:
                        value = self._decoder.decode(payload)
                    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # bad UTF-8 in a tag too
                        raise ProtocolError(f"undecodable frame: {str(exc)[:200]}") from None
                pos = end
                self.decoded += 1
                yield value
        finally:
            del buf[:pos]

    @property
    def header_seen(self) -> bool:
        """True once the stream header arrived (and was valid)."""
        return not self._need_header

    @property
    def pending_bytes(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)


class FrameBuffer(FrameParser[Message]):
    """Incremental decoder of wire messages for a non-blocking socket: feed bytes, take messages."""

    def __init__(self, expect_header: bool = True, limit: int = MAX_FRAME_BYTES) -> None:
        super().__init__(_decoder, expect_header, limit)

    def feed(self, data: bytes) -> list[Message]:
        """Append *data*; return every complete message now available."""
        self.append(data)
        return list(self.frames())

