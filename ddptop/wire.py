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
from typing import BinaryIO

import msgspec

from ddptop.errors import ProtocolError
from ddptop.protocol import PROTOCOL_VERSION, Message

MAGIC = b"DDPTOP"
HEADER = struct.Struct(">6sH")
LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 16 * 1024 * 1024

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


def decode_payload(payload: bytes) -> Message:
    """Decode one frame payload; ProtocolError if it is not a valid message."""
    try:
        return _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from None


def check_length(length: int, limit: int = MAX_FRAME_BYTES) -> None:
    """Refuse a frame length over *limit* before reading its payload."""
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes exceeds the {limit} limit")


class FrameBuffer:
    """Incremental decoder for a non-blocking socket: feed bytes, take messages."""

    def __init__(self, expect_header: bool = True, limit: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._need_header = expect_header
        self._limit = limit

    def feed(self, data: bytes) -> list[Message]:
        """Append *data*; return every complete message now available."""
        self._buf += data
        out: list[Message] = []
        if self._need_header:
            if len(self._buf) < HEADER.size:
                # A garbage peer is refused as soon as its first bytes disagree.
                if not MAGIC.startswith(bytes(self._buf[: len(MAGIC)])):
                    raise ProtocolError(f"not a ddptop stream (magic {bytes(self._buf)!r})")
                return out
            check_header(bytes(self._buf[: HEADER.size]))
            del self._buf[: HEADER.size]
            self._need_header = False
        while len(self._buf) >= LENGTH.size:
            (length,) = LENGTH.unpack_from(self._buf)
            check_length(length, self._limit)
            end = LENGTH.size + length
            if len(self._buf) < end:
                break
            out.append(decode_payload(bytes(self._buf[LENGTH.size : end])))
            del self._buf[:end]
        return out

    @property
    def header_seen(self) -> bool:
        """True once the stream header arrived (and was valid)."""
        return not self._need_header

    @property
    def pending_bytes(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)


def read_exact(stream: BinaryIO, size: int) -> bytes:
    """Read up to *size* bytes from a blocking stream (fewer only at end of stream)."""
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        chunk = stream.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def iter_stream(stream: BinaryIO, limit: int = MAX_FRAME_BYTES) -> Iterator[Message]:
    """Yield messages from a blocking stream that starts with a header.

    A stream that ends cleanly between frames simply stops. A stream cut inside a frame
    (a killed recorder) raises ProtocolError *after* every complete frame was yielded,
    so callers keep everything up to the damage.
    """
    check_header(read_exact(stream, HEADER.size))
    while True:
        raw = read_exact(stream, LENGTH.size)
        if not raw:
            return
        if len(raw) < LENGTH.size:
            raise ProtocolError("stream ended inside a frame length")
        (length,) = LENGTH.unpack(raw)
        check_length(length, limit)
        payload = read_exact(stream, length)
        if len(payload) < length:
            raise ProtocolError(f"stream ended inside a frame ({len(payload)} of {length} bytes)")
        yield decode_payload(payload)
