"""The `e` key: a diagnosis bundle of a live job, else (a replay) a JSON snapshot.

``ddptop.api.export(target, path)`` collects a live job into a bundle over its own
connections, as ``ddptop export`` does. Runs in a worker thread (a bundle asks every rank for history,
stacks and FR traces), on a copy of the model taken on the UI thread.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from ddptop import api
from ddptop.client.live import LiveSource
from ddptop.model.job import JobModel
from ddptop.source import JobSource
from ddptop.tui.findings import findings


def default_path(model: JobModel, now: float, suffix: str, directory: Path | None = None) -> Path:
    """ddptop-<job>-<YYYYmmdd-HHMMSS><suffix> in *directory* (default: the working dir)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return (directory or Path.cwd()) / f"ddptop-{model.job_id or 'job'}-{stamp}{suffix}"


def write_json_snapshot(model: JobModel, now: float, path: Path) -> Path:
    """The job snapshot, histories and findings at *now* as one JSON file."""
    doc = {"snapshot": model.snapshot(now), "histories": model.histories(),
           "findings": findings(model, now)}
    path.write_bytes(msgspec.json.format(msgspec.json.encode(doc)))
    return path


def export(source: JobSource, model: JobModel, now: float, directory: Path | None = None) -> tuple[Path, str]:
    """Write a bundle (live jobs) or the JSON fallback; returns (path, one-line summary).

    Raises on failure; the app reports the error in the UI.
    """
    if not isinstance(source, LiveSource):
        # A replay is a recording already (and a source without ranks has none to ask).
        path = write_json_snapshot(model, now, default_path(model, now, ".json", directory))
        return path, f"wrote a JSON snapshot: {path}"
    path = default_path(model, now, ".ddptop", directory)
    # A fresh connection set collects histories, stacks and FR traces (export_bundle's job).
    summary = api.export(source.target, path)
    return summary.path, summary.line()
