"""Safe reader of recordings and bundles: bounded, pickle-free, path-free, damage-tolerant.

Nothing in a file is trusted: sizes are checked before allocation, every frame is
decoded into a closed set of typed structs, rank numbers and counts are bounded, and no
name or path found inside is ever opened. A file cut short (a killed recorder) yields
every frame before the cut plus a warning; anything else that is wrong (foreign magic,
another version, corrupt or hostile content) is a one-line :class:`BundleError`.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ddptop.bundle import format as fmt
from ddptop.bundle.format import (
    ADDRESS_FACT,
    CrashFile,
    EndMarker,
    FindingsRecord,
    Frame,
    HostFacts,
    Manifest,
)
from ddptop.diagnosis.claims import Claim
from ddptop.errors import BundleError, ProtocolError
from ddptop.model.job import JobModel
from ddptop.protocol import EVENT_TYPES, ConnectionEvent, Event, HistoryMsg, RankExit, RecordEntry, StateMsg
from ddptop.wire import MAGIC, MAX_FRAME_BYTES, FrameParser

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
INFLATE_CHUNK = 4 << 20  # decompressed bytes per step: bounds memory per step


class _Truncated(Exception):
    """The file ends inside a gzip member (internal signal, not an error)."""


@dataclass
class Contents:
    """Everything a file holds, validated; events sorted by time."""

    path: Path
    manifest: Manifest
    events: list[Event] = field(default_factory=list)
    hosts: list[HostFacts] = field(default_factory=list)
    crash_files: dict[int, CrashFile] = field(default_factory=dict)
    findings: FindingsRecord | None = None
    end: EndMarker | None = None
    warnings: list[str] = field(default_factory=list)
    # What a console log's statements claim (#46: the monitored barrier's "from rank N", a
    # rank's own CUDA error, NCCL's lost peer): judged beside the rules; a bundle exported from
    # evidence keeps them in its findings record, read back here.
    log_claims: list[Claim] = field(default_factory=list)
    console_logs: int = 0  # console logs among the evidence read


def _chunks(fh: BinaryIO, compressed: bool) -> Iterator[bytes]:
    """Decompressed bytes of the file, member after member; _Truncated on a cut member."""
    if not compressed:
        while data := fh.read(READ_CHUNK):
            yield data
        return
    inflater = zlib.decompressobj(31)
    started = False
    while data := fh.read(READ_CHUNK):
        while data:
            started = True
            try:
                out = inflater.decompress(data, INFLATE_CHUNK)
            except zlib.error as exc:
                raise BundleError(f"corrupt compressed data ({exc})") from None
            if out:
                yield out
            if inflater.eof:
                data = inflater.unused_data
                inflater, started = zlib.decompressobj(31), False
            else:
                data = inflater.unconsumed_tail
    if started:
        raise _Truncated


def _check_time(t: float, what: str) -> None:
    if not math.isfinite(t) or not 0.0 <= t < 1e11:
        raise BundleError(f"hostile file: {what} has an impossible time {t!r}")


def _check_rank(rank: int, what: str) -> None:
    if not 0 <= rank < fmt.MAX_RANKS:
        raise BundleError(f"hostile file: {what} names rank {rank} (limit {fmt.MAX_RANKS})")


def _validate(frame: Frame, index: int) -> None:
    """Bounds a typed decode cannot express; BundleError if a frame oversteps them."""
    what = f"frame {index}"
    if isinstance(frame, Manifest):
        if not 0 <= frame.world_size <= fmt.MAX_RANKS:
            raise BundleError(f"hostile file: manifest claims {frame.world_size} ranks")
        for rank in frame.unanswered:
            _check_rank(rank, "manifest")
    elif isinstance(frame, RecordEntry):
        _check_time(frame.time, what)
        _check_rank(frame.rank, what)
        msg = frame.message
        if isinstance(msg, StateMsg):
            _check_rank(msg.state.rank, what)
            if not 0 <= msg.state.world_size <= fmt.MAX_RANKS:
                raise BundleError(f"hostile file: {what} claims {msg.state.world_size} ranks")
        elif isinstance(msg, HistoryMsg):
            _check_rank(msg.rank, what)
            if len(msg.samples) > fmt.MAX_SAMPLES_PER_FRAME:
                raise BundleError(f"hostile file: {what} holds {len(msg.samples)} samples")
            for s in msg.samples:
                _check_time(s.time, what)
        elif hasattr(msg, "rank"):
            _check_rank(msg.rank, what)
    elif isinstance(frame, ConnectionEvent | RankExit):
        _check_time(frame.time, what)
        _check_rank(frame.rank, what)
    elif isinstance(frame, CrashFile):
        _check_rank(frame.rank, what)
        if not fmt.is_plain_name(frame.name):
            raise BundleError(f"hostile file: crash file name {frame.name[:60]!r} is not a plain name")
        if len(frame.text) > fmt.MAX_CRASH_BYTES:
            raise BundleError(f"hostile file: crash file of rank {frame.rank} "
                              f"exceeds {fmt.MAX_CRASH_BYTES} bytes")
    elif isinstance(frame, HostFacts):
        if len(frame.ranks) > fmt.MAX_RANKS:
            raise BundleError(f"hostile file: host {frame.host[:40]!r} claims {len(frame.ranks)} ranks")
        for rank in frame.ranks:
            _check_rank(rank, what)


def _frame_budget(file_size: int) -> tuple[int, int]:
    """Frames and decompressed bytes a file of *file_size* bytes may hold.

    Recordings compress about 20:1 at 70-80 file bytes a frame; a crafted file of a
    million tiny identical frames compresses a thousandfold. Tying both budgets to the
    file's size keeps the memory a file can demand proportional to the file.
    """
    frames = min(fmt.MAX_FRAMES, fmt.FRAMES_FREE + file_size // fmt.MIN_FILE_BYTES_PER_FRAME)
    total = min(fmt.MAX_TOTAL_BYTES, fmt.BYTES_FREE + file_size * fmt.MAX_EXPANSION)
    return frames, total


def iter_frames(fh: BinaryIO, warnings: list[str]) -> Iterator[Frame]:
    """Validated frames of an open file; damage at the end becomes a warning."""
    head = fh.read(2)
    size = fh.seek(0, os.SEEK_END)
    fh.seek(0)
    compressed = head == fmt.GZIP_MAGIC
    if not compressed and head != MAGIC[:2]:
        raise BundleError(f"not a ddptop recording or bundle (starts with {head!r})")
    max_frames, max_total = _frame_budget(size)
    parser = FrameParser(fmt.decoder, limit=MAX_FRAME_BYTES)
    total = 0
    try:
        for chunk in _chunks(fh, compressed):
            total += len(chunk)
            if total > max_total:
                raise BundleError(f"file expands beyond {max_total >> 20} MiB "
                                  f"({size} bytes on disk); refusing it")
            try:
                parser.append(chunk)
            except ProtocolError as exc:
                raise BundleError(str(exc).replace("a ddptop stream", "a ddptop recording or bundle"))
            frames = parser.frames()
            while True:
                try:
                    frame = next(frames)
                except StopIteration:
                    break
                except ProtocolError as exc:
                    raise BundleError(f"corrupt frame {parser.decoded}: {exc}") from None
                if parser.decoded > max_frames:
                    raise BundleError(f"file holds more than {max_frames} frames for its "
                                      f"{size} bytes; refusing it")
                _validate(frame, parser.decoded - 1)
                yield frame
    except _Truncated:
        warnings.append("the file ends inside a compressed block (recorder killed?)")
    if not parser.header_seen:
        raise BundleError("file ends inside its header" if total else "empty file")
    if parser.pending_bytes:
        warnings.append(f"the file ends inside a frame ({parser.pending_bytes} bytes "
                        f"after frame {parser.decoded})")


def read_file(path: str | os.PathLike[str]) -> Contents:
    """Read and validate a recording or bundle; BundleError (one line) if unusable."""
    # Decoding allocates millions of small tracked objects and none of them form cycles:
    # pausing the cyclic GC meanwhile makes loading several times faster.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _read_file(Path(path))
    finally:
        if was_enabled:
            gc.enable()


def _read_file(p: Path) -> Contents:
    warnings: list[str] = []
    try:
        fh = open(p, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise BundleError(f"cannot read {p}: {exc.strerror or exc}") from None
    contents: Contents | None = None
    with fh:
        try:
            for frame in iter_frames(fh, warnings):
                if contents is None:
                    if not isinstance(frame, Manifest):
                        raise BundleError(f"{p.name}: the first frame is not a manifest")
                    if frame.schema_version != fmt.SCHEMA_VERSION:
                        raise BundleError(f"{p.name}: schema version {frame.schema_version} is not "
                                          f"supported (this ddptop reads {fmt.SCHEMA_VERSION})")
                    contents = Contents(path=p, manifest=frame)
                    continue
                _place(contents, frame)
        except BundleError as exc:
            raise BundleError(f"{p.name}: {exc}" if not str(exc).startswith(p.name) else str(exc)) from None
        except OSError as exc:
            raise BundleError(f"cannot read {p}: {exc.strerror or exc}") from None
    if contents is None:
        raise BundleError(f"{p.name}: the file ends before its manifest")
    if contents.end is None and not warnings:
        warnings.append("no end marker: the writer stopped without closing the file")
    contents.warnings = warnings
    # Recorders stamp events as they arrive, so this is nearly sorted (cheap) and stable.
    contents.events.sort(key=lambda e: e.time)
    for w in warnings:
        log.debug("%s: %s", p.name, w)
    return contents


def _place(contents: Contents, frame: Frame) -> None:
    if contents.end is not None:
        raise BundleError("frames follow the end marker")
    if isinstance(frame, EVENT_TYPES):
        contents.events.append(frame)
    elif isinstance(frame, Manifest):
        raise BundleError("a second manifest inside the file")
    elif isinstance(frame, HostFacts):
        contents.hosts.append(frame)
    elif isinstance(frame, CrashFile):
        contents.crash_files[frame.rank] = frame
    elif isinstance(frame, FindingsRecord):
        contents.findings = frame
        contents.log_claims += frame.claims[:fmt.MAX_CLAIMS]
    elif isinstance(frame, EndMarker):
        contents.end = frame


def build_model(contents: Contents) -> JobModel:
    """Fold every event of *contents* into a fresh JobModel."""
    model = JobModel(job_id=contents.manifest.job_id, world_size=contents.manifest.world_size)
    for event in contents.events:
        model.apply(event)
    for host in contents.hosts:
        address = host.facts.get(ADDRESS_FACT, "")
        if address:
            model.places.update((rank, (host.host, address)) for rank in host.ranks)
    return model


def end_time(contents: Contents) -> float:
    """The last moment the file describes."""
    if contents.events:
        return contents.events[-1].time
    return contents.end.time if contents.end is not None else contents.manifest.created


def load_model(path: str | os.PathLike[str]) -> tuple[JobModel, float]:
    """The job as the file last saw it, and that moment (a recording's or bundle's last word)."""
    contents = read_file(path)
    return build_model(contents), end_time(contents)
