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
from ddptop.errors import DdptopError, UsageError
from ddptop.evidence.scan import load_evidence
from ddptop.model.job import JobModel
from ddptop.model.rank_view import UNREACHABLE
from ddptop.protocol import ConnectionEvent


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


def unreachable_in_record(target: JobTarget, live: JobModel) -> list[ConnectionEvent]:
    """What this host's node agent recorded of other hosts it cannot reach (its exchange:
    their beats stopped, the connection open), for the ranks *live* did not hear: a viewer that
    attached after a link was cut knows since when, and which host (*live*'s places gain the
    record's). Nothing when the agent kept no record or it cannot be read."""
    if target.record is None:
        return []
    try:
        recorded = build_model(load_evidence([target.record], job_id=target.job_id))
    except DdptopError:
        return []
    # By host: the agent records its verdict rank by rank, and this read may fall between two
    # of them; a host's agent serves all its ranks, so what it said of one it says of all.
    lost_hosts = {recorded.places[r][0]: view for r, view in recorded.ranks.items()
                  if view.connection == UNREACHABLE and r in recorded.places}
    out: list[ConnectionEvent] = []
    for rank in sorted(set(recorded.ranks) | set(recorded.places)):
        heard = live.ranks.get(rank)
        if heard is not None and heard.base is not None:
            continue
        view = recorded.ranks.get(rank)
        if view is None or view.connection != UNREACHABLE:
            view = lost_hosts.get(recorded.places.get(rank, ("", ""))[0])
        if view is None or view.connection != UNREACHABLE:
            continue
        out.append(ConnectionEvent(time=recorded.last_time, rank=rank, status=UNREACHABLE,
                                   reason=view.connection_reason, since=view.unreachable_since))
        if rank in recorded.places:
            live.places.setdefault(rank, recorded.places[rank])
    return out
