"""What the api's functions are pointed at: a job (live or ended) or what a job left behind.

A target is a job id (or a unique prefix of one), ``MASTER_ADDR:MASTER_PORT``, ``slurm:JOB``,
nothing (the only job on this host), or paths to evidence: folders or files of Flight
Recorder dumps, torchrun's log, torchelastic error files, recordings and bundles. A word
that names an existing file or folder is a path; several words must all be paths.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ddptop.bundle.reader import build_model, end_time
from ddptop.client.targets import JobTarget, resolve
from ddptop.errors import DdptopError, UsageError
from ddptop.evidence.scan import load_evidence
from ddptop.model.job import JobModel
from ddptop.model.rank_view import UNREACHABLE
from ddptop.protocol import STUB_LOCAL_RANK, ConnectionEvent, RankState
from ddptop.status import Status
from ddptop.store import jobrecord
from ddptop.store.progress_page import apply_page
from ddptop.store.remains import read_progress_page, read_stuck

# What a caller may name: see the module's docstring. A JobTarget is one already resolved.
Target = str | os.PathLike[str] | JobTarget | None


def evidence_paths(words: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The paths among *words* ([] when the one word names a job); UsageError on a mix."""
    if not words:
        return []
    paths = [Path(w) for w in words if Path(w).exists() or Path(w).is_symlink()]
    if len(words) == 1:
        return paths
    if len(paths) != len(words):
        missing = [str(w) for w in words if not (Path(w).exists() or Path(w).is_symlink())]
        raise UsageError(f"no such file or folder: {', '.join(missing)} (several targets must all be paths)")
    return paths


def job_of(target: Target, timeout_s: float = 5.0) -> JobTarget:
    """*target* resolved to a job's endpoints (TargetNotFound with the reason if there is none)."""
    if isinstance(target, JobTarget):
        return target
    return resolve(None if target is None else os.fspath(target), store_timeout_s=timeout_s)


def ended_model(target: JobTarget, warnings: list[str]) -> tuple[JobModel, float]:
    """An ended job as its job record tells it (the node agent's black box, with its ranks'
    last words), and the moment it describes: what ``doctor``, ``snapshot`` and ``replay``
    read once no rank is left to ask. The evidence's warnings are added to *warnings*."""
    assert target.record is not None
    contents = load_evidence([target.record], job_id=target.job_id)
    warnings.extend(contents.warnings)
    return build_model(contents), end_time(contents)


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
    record = jobrecord.read_record(target.job_id)
    agent_host = record.host if record is not None else ""  # a record older than seen_by
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
                                   reason=view.connection_reason, since=view.unreachable_since,
                                   seen_by=view.unreachable_seen_by or agent_host))
        if rank in recorded.places:
            live.places.setdefault(rank, recorded.places[rank])
    return out


def last_known(target: JobTarget) -> dict[int, RankState]:
    """Every rank's last known state on this host, for the ranks that did not answer: its last
    recorded state (the black box), its progress page's step (mapped shared: current even
    while it is wedged) and where its node agent found it stuck (its ``.stuck`` report)."""
    states: dict[int, RankState] = {}
    if target.record is not None:
        try:
            contents = load_evidence([target.record], job_id=target.job_id)
            states = build_model(contents).snapshot(time.time()).by_rank()
        except DdptopError:
            states = {}
    for rank in range(target.world_size):
        page, stuck = read_progress_page(target.job_id, rank), read_stuck(target.job_id, rank)
        state = states.get(rank)
        if state is None and page is None and stuck is None:
            continue
        if state is None:
            pid = stuck.pid if stuck is not None else page.pid if page is not None else 0
            state = RankState(rank=rank, local_rank=STUB_LOCAL_RANK, world_size=target.world_size, host="",
                              pid=pid, job_id=target.job_id, status=Status.STALE)
        if page is not None:
            state = apply_page(state, page)
        if stuck is not None and stuck.pid == state.pid:
            state = msgspec.structs.replace(state, stuck=stuck, time=max(state.time, stuck.since))
        states[rank] = state
    return states


def wait_closed(job_id: str, timeout_s: float) -> None:
    """A job that just ended: give its node agent up to *timeout_s* to record how the last
    ranks ended and close the record (it may still be writing), so no rank reads as running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = jobrecord.read_record(job_id)
        if record is None or record.ended:
            return
        time.sleep(0.1)
