"""Crash-safe writer: frames go into independent gzip members, one flushed every second.

A member is only ever appended whole (``write`` + ``flush`` of a complete member), so a
recorder killed at any instant leaves a file whose every member but possibly the last is
intact; the reader keeps everything before the damage. Bundles are written to a
temporary name and renamed into place, so an export is either whole or absent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from pathlib import Path

from ddptop.bundle.format import MAX_FRAME_BYTES, EndMarker, Frame, Manifest, encoder
from ddptop.bundle.scrub import scrub_frame
from ddptop.errors import BundleError
from ddptop.wire import LENGTH, header_bytes

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
FLUSH_BYTES = 4 * 1024 * 1024  # a member is cut early when this much is pending


def _gzip_member(data: bytes, level: int) -> bytes:
    # One self-contained gzip member (RFC 1952), mtime 0 so equal input gives equal bytes.
    comp = zlib.compressobj(level, zlib.DEFLATED, 31)
    return comp.compress(data) + comp.flush()


class BundleWriter:
    """Writes a manifest, then frames; thread-safe; ``close()`` adds the end marker."""

    def __init__(self, path: str | os.PathLike[str], manifest: Manifest, *, compress: bool = True,
                 atomic: bool = False, level: int = 6, flush_interval_s: float = FLUSH_INTERVAL_S,
                 flush_bytes: int = FLUSH_BYTES) -> None:
        self.path = Path(path)
        self._final = self.path
        self._compress, self._level, self._interval = compress, level, flush_interval_s
        self._flush_bytes = flush_bytes
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._last_flush = time.monotonic()
        self.frames = 0
        self.bytes_written = 0
        self.closed = False
        if atomic:
            self.path = self._final.with_name(f".{self._final.name}.tmp{os.getpid()}")
        try:
            # Never through a link: recordings go into the runtime directory, where another
            # user's symlink must not redirect them.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise BundleError(f"cannot write {self._final}: {exc.strerror or exc}") from None
        # Unbuffered: a member is written with os-level writes whose progress is known, so a
        # failed one (disk full) can be cut off again, never left half in the file.
        self._fh = os.fdopen(fd, "wb", buffering=0)
        self._good = 0  # end of the last complete member
        self.write_errors = 0
        self._pending.append(header_bytes())
        self._add(manifest)
        self.flush()  # the header and manifest are on disk before any event

    def write(self, frame: Frame) -> None:
        """Scrub and queue one frame; flushes when a second has passed or much is pending."""
        with self._lock:
            if self.closed:
                return
            self._add(scrub_frame(frame))
            if (self._pending_bytes >= self._flush_bytes
                    or time.monotonic() - self._last_flush >= self._interval):
                self._flush_locked()

    def flush_if_due(self) -> None:
        """Flush if the interval passed (call from a timer so quiet periods are flushed too)."""
        with self._lock:
            if not self.closed and self._pending and time.monotonic() - self._last_flush >= self._interval:
                self._flush_locked()

    def flush(self) -> None:
        """Write everything pending as one complete member and hand it to the OS."""
        with self._lock:
            self._flush_locked()

    def close(self, reason: str = "closed") -> None:
        """Write the end marker, flush, fsync, and (atomic mode) move the file into place."""
        with self._lock:
            if self.closed:
                return
            self._add(EndMarker(time=time.time(), reason=reason, frames=self.frames))
            self._flush_locked()
            self.closed = True
            try:
                os.fsync(self._fh.fileno())
            finally:
                self._fh.close()
        if self.path != self._final:
            os.replace(self.path, self._final)
            self.path = self._final

    def abort(self) -> None:
        """Close without the end marker; a temporary (atomic) file is removed."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._fh.close()
        if self.path != self._final:
            self.path.unlink(missing_ok=True)

    def _add(self, frame: Frame) -> None:
        payload = encoder.encode(frame)
        if len(payload) > MAX_FRAME_BYTES:
            # Dropping one oversized frame beats failing a whole recording.
            log.warning("dropping a %s frame of %d bytes (limit %d)", type(frame).__name__,
                        len(payload), MAX_FRAME_BYTES)
            return
        self._pending.append(LENGTH.pack(len(payload)))
        self._pending.append(payload)
        self._pending_bytes += len(payload) + LENGTH.size
        self.frames += 1

    def _flush_locked(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        blob = _gzip_member(data, self._level) if self._compress else data
        try:
            view = memoryview(blob)
            while view:
                view = view[self._fh.write(view) or 0:]
        except OSError as exc:
            self.write_errors += 1
            # A partial member would make the rest of the file unreadable: cut it off, so
            # everything written before stays readable and later members can follow.
            try:
                os.ftruncate(self._fh.fileno(), self._good)
                self._fh.seek(self._good)
            except OSError:
                pass
            raise BundleError(f"cannot write {self._final}: {exc.strerror or exc}") from None
        self._good += len(blob)
        self.bytes_written += len(blob)
