"""Bundle benchmark: export time, file size and replay open time for 64 ranks x 10 minutes.

Run: ``.venv/bin/python bench/bundle_bench.py``. Everything is synthetic and in-process
(realistic RankStates, 600 one-second samples per rank), so it measures the format, the
writer and the reader, not the network. Targets: export <= 2 s, replay open <= 1 s.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddptop._version import __version__
from ddptop.bundle.format import SCHEMA_VERSION, Manifest
from ddptop.bundle.replay_source import ReplaySource
from ddptop.bundle.writer import BundleWriter
from ddptop.testing.bundles import bundle_events, recording_events

WORLD, SECONDS = 64, 600


def _write(path: Path, kind: str, events: list) -> float:  # type: ignore[type-arg]
    began = time.perf_counter()
    manifest = Manifest(schema_version=SCHEMA_VERSION, kind=kind, created=time.time(),  # type: ignore[arg-type]
                        job_id="synthetic", world_size=WORLD, ddptop_version=__version__,
                        hosts=[f"node-{i}" for i in range(WORLD // 8)])
    writer = BundleWriter(path, manifest, atomic=kind == "bundle", flush_interval_s=1.0)
    for event in events:
        writer.write(event)
    writer.close("bench")
    return time.perf_counter() - began


def _open(path: Path) -> float:
    began = time.perf_counter()
    source = ReplaySource(path)
    source.model_at(source.end_time)
    return time.perf_counter() - began


def main() -> None:
    """Print the table."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, label, events in (
            ("bundle", f"export bundle ({WORLD} ranks, {SECONDS}-sample histories)",
             bundle_events(WORLD, SECONDS)),
            ("recording", f"recording ({WORLD} ranks x {SECONDS} s of 1 Hz states)",
             recording_events(WORLD, SECONDS)),
        ):
            path = Path(tmp) / f"{kind}.ddptop"
            write_s = _write(path, kind, events)
            open_s = min(_open(path) for _ in range(3))
            rows.append((label, len(events), write_s, os.path.getsize(path), open_s))
    print(f"{'file':58} {'frames':>7} {'write s':>8} {'size':>10} {'open s':>7}")
    for label, frames, write_s, size, open_s in rows:
        print(f"{label:58} {frames:>7} {write_s:>8.2f} {size / 1e6:>8.2f}MB {open_s:>7.2f}")
    print("targets: export (bundle write) <= 2 s, replay open (load + model_at(end)) <= 1 s")


if __name__ == "__main__":
    main()
