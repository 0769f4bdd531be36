"""The black box: a job's recording, always on, bounded, crash-safe.

Written by the node agent (``ddptop launch``), which outlives the ranks, into the job's
record directory as ordinary recordings (the format of ``ddptop record``, see
``docs/bundle-format.md``), in two tiers so that a size cap costs detail only in the past:

* ``recent.<n>.ddptop``: every frame at full rate. A segment is closed after
  ``segment_s`` seconds or a fifth of the cap, and only the newest two are kept, so the
  last minutes before a crash are always there in full;
* ``history.ddptop``: everything that is not a periodic state (connections, exits, last
  words (final states), crash files, histories, stacks) plus one state per rank every
  ``stride`` seconds.
  When it outgrows two fifths of the cap it is compacted: the stride doubles, and only the
  states on the new stride (and the newest history frame of each rank) are kept.

Unflushed data is bounded too (a member is cut at a twentieth of the cap), so the files
stay under the cap at any moment, with one exception: when what is never thinned (exits,
connections, last words) alone fills the history's share, history grows past it.

Each file is flushed as independent gzip members at least once a second (BundleWriter),
so a SIGKILLed agent still leaves everything up to its last second. Readers merge the tiers
(:func:`ddptop.bundle.record_dir.read_recording`).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from ddptop.bundle.format import CrashFile, Frame, Manifest
from ddptop.bundle.reader import read_file
from ddptop.bundle.record_dir import HISTORY_FILE, RECENT_GLOB
from ddptop.bundle.writer import BundleWriter
from ddptop.protocol import HistoryMsg, RecordEntry, StateMsg
from ddptop.status import FINAL

log = logging.getLogger(__name__)

RECENT_PATTERN = RECENT_GLOB  # the names the reader (bundle.record_dir) looks for
DEFAULT_CAP_BYTES = 32 * 1024 * 1024
DEFAULT_SEGMENT_S = 120.0
DEFAULT_STRIDE_S = 10.0
RECENT_SEGMENTS_KEPT = 2


def recent_name(index: int) -> str:
    """File name of recent segment *index* (zero-padded so names sort by index)."""
    return f"recent.{index:06d}.ddptop"


class JobRecording:
    """Thread-safe sink of frames into a job's record directory, within *cap_bytes*."""

    def __init__(self, directory: Path, manifest: Manifest, cap_bytes: int = DEFAULT_CAP_BYTES,
                 segment_s: float = DEFAULT_SEGMENT_S, stride_s: float = DEFAULT_STRIDE_S) -> None:
        self.directory = directory
        self.manifest = manifest
        self.cap_bytes = max(256 * 1024, cap_bytes)
        self.segment_s = segment_s
        self.stride_s = stride_s
        self.compactions = 0
        self.frames = 0
        self._lock = threading.Lock()
        self._kept_at: dict[int, float] = {}  # rank -> time of the last state kept in history
        self._flush_bytes = max(16 * 1024, self.cap_bytes // 20)
        self._history = self._writer(directory / HISTORY_FILE)
        self._segment = 0
        self._segments: list[Path] = []
        self._recent = self._open_segment()
        self._compact_at = self.cap_bytes * 2 // 5
        self.closed = False

    # ------------------------------------------------------------ writing

    def write(self, frame: Frame) -> None:
        """Record one frame (a state goes to the recent tier, and to history on its stride)."""
        with self._lock:
            if self.closed:
                return
            self.frames += 1
            # Periodic states go to the recent tier (and history on its stride); last words
            # (a final state) are not periodic: they go to history, in order with the
            # connection loss that follows them, so a reader never sees one without the other.
            if (isinstance(frame, RecordEntry) and isinstance(frame.message, StateMsg)
                    and frame.message.state.status not in FINAL):
                self._recent.write(frame)
                if frame.time - self._kept_at.get(frame.rank, float("-inf")) >= self.stride_s:
                    self._kept_at[frame.rank] = frame.time
                    self._history.write(frame)
            else:
                self._history.write(frame)
            self._bound()

    def flush_if_due(self) -> None:
        """Flush both tiers if a second passed (call from a timer: quiet jobs get flushed too)."""
        with self._lock:
            if not self.closed:
                self._recent.flush_if_due()
                self._history.flush_if_due()
                self._bound()

    def close(self, reason: str) -> None:
        """Close both tiers with an end marker (a recording without one was cut short)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._recent.close(reason)
            self._history.close(reason)

    @property
    def bytes_on_disk(self) -> int:
        """Current size of the recording's files."""
        total = 0
        for path in [self.directory / HISTORY_FILE, *self._segments]:
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total

    # ------------------------------------------------------------ bounds

    def _open_segment(self) -> BundleWriter:
        self._segment += 1
        path = self.directory / recent_name(self._segment)
        self._segments.append(path)
        self._segment_started = time.monotonic()
        return self._writer(path)

    def _writer(self, path: Path) -> BundleWriter:
        return BundleWriter(path, self.manifest, flush_bytes=self._flush_bytes)

    def _bound(self) -> None:
        if (self._recent.bytes_written >= self.cap_bytes // 5
                or time.monotonic() - self._segment_started >= self.segment_s):
            self._recent.close("rotated")
            self._recent = self._open_segment()
            while len(self._segments) > RECENT_SEGMENTS_KEPT:
                self._segments.pop(0).unlink(missing_ok=True)
        if self._history.bytes_written >= self._compact_at:
            self._compact()

    def _compact(self) -> None:
        """Rewrite history on a doubled stride; the new file replaces the old atomically."""
        path = self.directory / HISTORY_FILE
        self._history.flush()
        contents = read_file(path)
        self.stride_s *= 2
        self.compactions += 1
        tmp = path.with_name(f".{path.name}.compact")
        writer = self._writer(tmp)
        last_history: dict[int, RecordEntry] = {}
        kept_at: dict[int, float] = {}
        for event in contents.events:
            if isinstance(event, RecordEntry) and isinstance(event.message, HistoryMsg):
                last_history[event.rank] = event  # only the newest per rank survives
                continue
            if (isinstance(event, RecordEntry) and isinstance(event.message, StateMsg)
                    and event.message.state.status not in FINAL):  # last words are never thinned
                if event.time - kept_at.get(event.rank, float("-inf")) < self.stride_s:
                    continue
                kept_at[event.rank] = event.time
            writer.write(event)
        for event in last_history.values():
            writer.write(event)
        for crash in contents.crash_files.values():
            writer.write(crash)
        writer.flush()
        tmp.replace(path)  # the open writer follows the file to its new name
        self._history.abort()
        self._history = writer
        self._kept_at = kept_at
        # Only states thin out: if what must be kept (exits, last words, connections) already
        # fills much of the budget, wait for real growth instead of compacting on every write.
        self._compact_at = max(self.cap_bytes * 2 // 5, writer.bytes_written * 3 // 2)
        log.debug("compacted %s to a %g s stride: %d bytes", path, self.stride_s, writer.bytes_written)


def crash_frame(rank: int, name: str, text: str, limit: int) -> CrashFile:
    """A crash file as a frame, keeping its tail when it is longer than *limit*."""
    data = text.encode("utf-8", "replace")
    truncated = len(data) > limit
    if truncated:
        text = data[-limit:].decode("utf-8", "replace")
    return CrashFile(rank=rank, name=name, text=text, truncated=truncated)
