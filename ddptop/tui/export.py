"""The `e` key: a diagnosis bundle when the bundle package exists, else a JSON snapshot.

``ddptop.bundle.export.export_bundle(target, path)`` collects a live job into a bundle
over its own connections; it is imported lazily so the dashboard works without it. Runs
in a worker thread (a bundle asks every rank for history, stacks and FR traces).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from ddptop.model.job import JobModel
from ddptop.source import JobSource
from ddptop.tui.findings import findings


def _bundle_exporter() -> Any | None:
    try:
        from ddptop.bundle import export as bundle_export
    except ImportError:
        return None
    return getattr(bundle_export, "export_bundle", None)


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
    exporter = _bundle_exporter()
    target = getattr(source, "target", None)
    if exporter is None or target is None or not getattr(source, "live", False):
        # Replays are bundles already, and fakes have no ranks to ask: write what we see.
        path = write_json_snapshot(model, now, default_path(model, now, ".json", directory))
        return path, f"wrote a JSON snapshot: {path}"
    path = default_path(model, now, ".ddptop", directory)
    # A fresh connection set collects histories, stacks and FR traces (export_bundle's job).
    summary = exporter(target, path)
    line = summary.line() if hasattr(summary, "line") else f"wrote a diagnosis bundle: {path}"
    return Path(getattr(summary, "path", path)), str(line)
