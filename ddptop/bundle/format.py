"""The one file format of recordings and bundles: the wire stream, behind gzip members.

Layout (see ``docs/bundle-format.md``)::

    file    = gzip member, gzip member, ...   (or the raw stream, uncompressed)
    stream  = b"DDPTOP" + u16 protocol version, then frames
    frame   = u32 big-endian length + msgpack(Frame)
    frames  = Manifest, then RecordEntry / ConnectionEvent / RankExit / HostFacts /
              CrashFile / FindingsRecord ..., and an EndMarker when the writer closed cleanly

Each gzip member is complete and independent, and the writer flushes one at least every
second, so a killed recorder leaves every member but the last intact. Frames other than
the wire protocol's own live here, decoded by this module's own closed union, so the
rank-side protocol stays unchanged.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from ddptop.diagnosis.claims import Claim
from ddptop.diagnosis.finding import Finding
from ddptop.protocol import ConnectionEvent, RankExit, RecordEntry  # Event: the one union
from ddptop.wire import MAX_FRAME_BYTES as MAX_FRAME_BYTES  # one frame limit, sockets and files

SCHEMA_VERSION = 1
GZIP_MAGIC = b"\x1f\x8b"

# Bounds every reader enforces, whatever the file claims (a hostile file cannot make us
# allocate or loop beyond these).
MAX_TOTAL_BYTES = 1024 * 1024 * 1024  # decompressed
MAX_FRAMES = 5_000_000
# ... and in proportion to the file's size (see reader._frame_budget): a small file
# cannot demand much memory, whatever it claims.
FRAMES_FREE = 20_000
MIN_FILE_BYTES_PER_FRAME = 8  # recordings take 70-80
BYTES_FREE = 16 * 1024 * 1024
MAX_EXPANSION = 100  # decompressed bytes per file byte; recordings expand about 20:1
MAX_RANKS = 1 << 16
MAX_SAMPLES_PER_FRAME = 100_000
MAX_CRASH_BYTES = 256 * 1024
MAX_TEXT_BYTES = 8 * 1024 * 1024
MAX_CLAIMS = 256  # a console log's claims kept in a findings record (as many as a log gives)

Kind = Literal["recording", "bundle"]


class Manifest(msgspec.Struct, tag="manifest", kw_only=True):
    """First frame of every file: what it is, of which job, written by whom."""

    schema_version: int
    kind: Kind
    created: float  # wall clock when the writer opened the file
    job_id: str
    world_size: int
    ddptop_version: str
    hosts: list[str] = []
    # Bundles only: ranks that did not answer the export, with why.
    unanswered: dict[int, str] = {}
    note: str = ""


ADDRESS_FACT = "address"  # the address other hosts reach the host's ranks at (the node agent's recordings)


class HostFacts(msgspec.Struct, tag="host", kw_only=True):
    """Facts about one host, as its ranks reported them (bundles), or as the job's store
    published them (the node agent's recordings: ``facts["address"]``)."""

    host: str
    ranks: list[int]
    facts: dict[str, str] = {}


class CrashFile(msgspec.Struct, tag="crash_file", kw_only=True):
    """A dead rank's faulthandler file, as text (bounded; never a path to open)."""

    rank: int
    name: str  # the file's base name on the recording host, informational only
    text: str
    truncated: bool = False


class FindingsRecord(msgspec.Struct, tag="findings", kw_only=True):
    """The diagnosis at export time."""

    time: float
    findings: list[Finding] = []
    error: str = ""  # why there are none (diagnosis unavailable or failed)
    # What the console logs among the evidence claimed (#46: the monitored barrier's "from
    # rank N", a rank's own CUDA error, NCCL's lost peer): kept so the bundle is judged as the
    # logs were (read back into Contents.log_claims). A field with a default: older files, none.
    claims: list[Claim] = []


class EndMarker(msgspec.Struct, tag="end", kw_only=True):
    """Last frame of a file closed on purpose; its absence means the writer died."""

    time: float
    reason: str = ""
    frames: int = 0


Frame = (Manifest | RecordEntry | ConnectionEvent | HostFacts | CrashFile | FindingsRecord | EndMarker
         | RankExit)

encoder = msgspec.msgpack.Encoder()
decoder: msgspec.msgpack.Decoder[Frame] = msgspec.msgpack.Decoder(Frame)


def is_plain_name(name: str) -> bool:
    """True if *name* is a bare file name (no directory part, no traversal, printable)."""
    return (bool(name) and len(name) <= 255 and "/" not in name and "\\" not in name
            and name not in (".", "..") and name.isprintable())
