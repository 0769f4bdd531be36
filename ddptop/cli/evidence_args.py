"""What the verbs that read a job after the fact share: telling paths from job names.

``doctor``, ``replay`` and ``export`` take either one job (an id, ``MASTER_ADDR:PORT``)
or any number of paths to what a job left behind. A word that names an existing file or
folder is a path; several words must all be paths.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from ddptop.bundle.reader import build_model, end_time
from ddptop.client.targets import JobTarget
from ddptop.errors import UsageError
from ddptop.evidence.scan import load_evidence
from ddptop.model.job import JobModel


def evidence_paths(words: Sequence[str]) -> list[Path]:
    """The paths among *words* ([] when the one word names a job); UsageError on a mix."""
    if not words:
        return []
    paths = [Path(w) for w in words if Path(w).exists() or Path(w).is_symlink()]
    if len(words) == 1:
        return paths
    if len(paths) != len(words):
        missing = [w for w in words if not (Path(w).exists() or Path(w).is_symlink())]
        raise UsageError(f"no such file or folder: {', '.join(missing)} (several targets must all be paths)")
    return paths


def ended_model(target: JobTarget) -> tuple[JobModel, float]:
    """An ended job as its record tells it (the node agent's black box, with its ranks' last
    words), and the moment it describes: what ``doctor``, ``snapshot`` and ``replay`` read
    once no rank is left to ask."""
    assert target.record is not None
    contents = load_evidence([target.record], job_id=target.job_id)
    warn(contents.warnings)
    return build_model(contents), end_time(contents)


def warn(warnings: Iterable[str], limit: int = 20) -> None:
    """Print evidence warnings on stderr, one line each, at most *limit* of them."""
    shown = list(warnings)
    for line in shown[:limit]:
        print(f"ddptop: warning: {line}", file=sys.stderr)
    if len(shown) > limit:
        print(f"ddptop: warning: ... and {len(shown) - limit} more", file=sys.stderr)
