"""Read a job's black-box record (a directory of recordings) as one :class:`Contents`.

The node agent writes ``history.ddptop`` (thinned) and ``recent.<n>.ddptop`` (full rate;
the newest two segments) into the job's directory (:mod:`ddptop.agent.recording`). Read
together they are one recording: every event once, in time order, states present in
both tiers counted once. A single file is read as it is, so every caller can take either.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddptop.bundle.reader import Contents, build_model, end_time, read_file
from ddptop.errors import BundleError
from ddptop.model.job import JobModel
from ddptop.protocol import Event, RecordEntry, StateMsg

HISTORY_FILE = "history.ddptop"
RECENT_GLOB = "recent.*.ddptop"


def recording_files(directory: Path) -> list[Path]:
    """The files of a record directory, history first, then recent segments in order."""
    history = directory / HISTORY_FILE
    files = [history] if history.is_file() else []
    return files + sorted(p for p in directory.glob(RECENT_GLOB) if p.is_file() and not p.is_symlink())


def read_recording(path: str | os.PathLike[str]) -> Contents:
    """A recording, a bundle, or a job's record directory, read and merged."""
    p = Path(path)
    if not p.is_dir():
        return read_file(p)
    files = recording_files(p)
    if not files:
        raise BundleError(f"{p}: no recording in this job record (recording was off?)")
    merged: Contents | None = None
    seen_states: set[tuple[int, float]] = set()
    for file in files:
        try:
            part = read_file(file)
        except BundleError as exc:
            if merged is None:
                raise
            # A segment cut by a killed agent loses only itself; the rest still tells.
            merged.warnings.append(f"{file.name}: {exc}")
            continue
        if merged is None:
            merged = Contents(path=p, manifest=part.manifest, warnings=[])
        merged.events += [e for e in part.events if _first_time(e, seen_states)]
        merged.hosts += part.hosts
        merged.crash_files.update(part.crash_files)
        merged.findings = part.findings or merged.findings
        merged.end = part.end if file.name == HISTORY_FILE else merged.end
        merged.warnings += [f"{file.name}: {w}" for w in part.warnings
                            if "no end marker" not in w or file.name == HISTORY_FILE]
    assert merged is not None
    merged.events.sort(key=lambda e: e.time)
    return merged


def _first_time(event: Event, seen: set[tuple[int, float]]) -> bool:
    # History keeps a copy of some states that are also in a recent segment.
    if isinstance(event, RecordEntry) and isinstance(event.message, StateMsg):
        key = (event.rank, event.message.state.time)
        if key in seen:
            return False
        seen.add(key)
    return True


def load_recording_model(path: str | os.PathLike[str]) -> tuple[JobModel, float]:
    """The job as a recording, bundle or record directory last saw it, and that moment."""
    contents = read_recording(path)
    return build_model(contents), end_time(contents)
