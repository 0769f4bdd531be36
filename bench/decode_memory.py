"""Peak memory of reading crafted and honest files, under the old caps and the new ones.

    .venv/bin/python bench/decode_memory.py

Files: a crafted recording of one million tiny valid frames (gzip, ~200 KB), a
decompression bomb of valid frames (repeated text), and an honest recording of about
the same size. Each is read with ``read_file`` under tracemalloc twice: with the old
caps (5M frames, 2 GiB, nothing relative to the file size) and with the new budget (in
proportion to the file's size). Prints outcome and tracemalloc peak per row.
"""

from __future__ import annotations

import gzip
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.bundle import format as fmt
from ddptop.bundle.reader import read_file
from ddptop.bundle.writer import BundleWriter
from ddptop.errors import BundleError
from ddptop.protocol import ConnectionEvent, FrTraceMsg, RecordEntry
from ddptop.testing.bundles import recording_events
from ddptop.wire import LENGTH, header_bytes

OLD = {"FRAMES_FREE": 5_000_000, "MIN_FILE_BYTES_PER_FRAME": 1 << 60, "BYTES_FREE": 2 << 30,
       "MAX_EXPANSION": 0, "MAX_TOTAL_BYTES": 2 << 30}
NEW = {k: getattr(fmt, k) for k in OLD}


def _manifest() -> fmt.Manifest:
    return fmt.Manifest(schema_version=fmt.SCHEMA_VERSION, kind="recording", created=time.time(),
                        job_id="j", world_size=64, ddptop_version="0")


def _raw(frames: list[object]) -> bytes:
    out = header_bytes()
    for frame in frames:
        payload = fmt.encoder.encode(frame)
        out += LENGTH.pack(len(payload)) + payload
    return out


def _files(work: Path) -> dict[str, Path]:
    tiny = fmt.encoder.encode(ConnectionEvent(time=1.0, rank=0, status="lost"))
    crafted = work / "million-tiny.ddptop"
    crafted.write_bytes(gzip.compress(_raw([_manifest()]) + (LENGTH.pack(len(tiny)) + tiny) * 1_000_000, 9))
    bomb = work / "bomb.ddptop"
    big = RecordEntry(time=1.0, rank=0, message=FrTraceMsg(rank=0, time=1.0, json="0" * (15 << 20)))
    bomb.write_bytes(gzip.compress(_raw([_manifest()] + [big] * 8), 6))
    honest = work / "honest.ddptop"
    writer = BundleWriter(honest, _manifest(), flush_interval_s=1.0)
    for event in recording_events(64, 40):
        writer.write(event)
    writer.close("bench")
    return {"1M tiny frames": crafted, "text bomb": bomb, "honest 64 ranks x 40 s": honest}


def _measure(path: Path) -> tuple[str, float]:
    tracemalloc.start()
    try:
        contents = read_file(path)
        outcome = f"read: {len(contents.events)} events"
    except BundleError as exc:
        outcome = f"BundleError: {str(exc).split(': ', 1)[-1][:60]}"
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return outcome, peak / 2**20


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="ddptop-decode-"))
    files = _files(work)
    print(f"{'file':24} {'size KB':>8} {'caps':5} {'tracemalloc peak MB':>20}  outcome")
    for name, path in files.items():
        for label, caps in (("old", OLD), ("new", NEW)):
            for key, value in caps.items():
                setattr(fmt, key, value)
            outcome, peak = _measure(path)
            print(f"{name:24} {path.stat().st_size / 1024:>8.0f} {label:5} {peak:>20.1f}  {outcome}")
    for key, value in NEW.items():
        setattr(fmt, key, value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
