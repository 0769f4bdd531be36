"""``api.jobs()``: the jobs on this host, running and ended, and how each rank ended.

Running jobs come from their ranks' discovery entries; ended jobs from the job record their
node agent (``ddptop launch``) kept. Each job is one :class:`JobEntry`, the row of
``ddptop jobs --json``: its field names are a public interface (add, never rename).
"""

from __future__ import annotations

from collections import Counter

import msgspec

from ddptop.client import host_jobs
from ddptop.status import Status
from ddptop.store import discovery, jobrecord
from ddptop.store.jobrecord import JobRecord
from ddptop.textfmt import rank_ranges


class OutcomeEntry(msgspec.Struct, kw_only=True):
    """How one rank of a job ended, as its node agent recorded it (an item of ``outcome``)."""

    rank: int
    pid: int
    status: str
    exit_code: int | None = None
    signal: str = ""
    time: float = 0.0


class JobEntry(msgspec.Struct, kw_only=True):
    """One job on this host: a row of ``ddptop jobs --json`` (fields in that document's order)."""

    job_id: str
    world_size: int
    alive: int  # ranks with a live process
    ranks: list[int]  # the live ranks, with their pids and ports below
    pids: list[int]
    ports: list[int]
    hosts: list[str]
    start_time: float
    # added with the black box:
    state: str  # "running", "ended" or "orphaned" (its agent died without closing the record)
    end_time: float
    exit_code: int | None
    command: list[str]
    record_bytes: int
    outcome: list[OutcomeEntry]
    outcome_text: str
    # added with fleet metrics: where this host's agent serves them ("" when it does not)
    metrics_url: str
    # added with #22: the scheduler's names of the job ("12345.0", SLURM's job.step)
    scheduler_job: str
    job_name: str
    # added with #22: where the ranks' discovery entries were found (another mount namespace's
    # /tmp, seen through /proc/PID/root, when the job's /tmp is private)
    runtime_dir: str = ""


def jobs(*, include_unrecorded: bool = False) -> list[JobEntry]:
    """Every job on this host, oldest first: those with live ranks and those whose node agent
    kept a job record (*include_unrecorded*: also jobs that left no job record, ranks started
    without ``ddptop launch``). An empty list is an answer, not an error."""
    found = host_jobs.scan()
    live, every = found.live, found.every
    records = {r.job_id: r for r in jobrecord.list_records()}
    for job_id, hidden in found.hidden.items():  # a job in a private /tmp keeps its record there
        if job_id not in records:
            discovery.view_runtime_dir(hidden.path)
            try:
                record = jobrecord.read_record(job_id)
            finally:
                discovery.view_runtime_dir(None)
            if record is not None:
                records[job_id] = record
    names = set(live) | set(records) | (set(every) if include_unrecorded else set())
    entries: list[JobEntry] = []
    for job in names:
        record = records.get(job)
        earlier = found.earlier.get(job, [])
        if host_jobs.record_of_earlier_job(record, live.get(job, [])):
            earlier_record, record = record, None
        else:
            earlier_record = None
        entries.append(_entry(job, live.get(job, []), every.get(job, []), record))
        # An ended job that had the id of a live one (#49) is a row of its own: ended.
        if earlier_record is not None or (earlier and include_unrecorded):
            entries.append(_entry(job, [], earlier, earlier_record))
    for entry in entries:
        place = found.hidden.get(entry.job_id) if entry.alive or entry.job_id not in found.earlier else None
        entry.runtime_dir = str(place.path) if place else str(discovery.runtime_dir(False))
    return sorted(entries, key=lambda e: (e.start_time, e.job_id))


def _entry(job: str, alive: list[discovery.Endpoint], ranks: list[discovery.Endpoint],
           record: JobRecord | None) -> JobEntry:
    starts = [e.start_time for e in ranks if e.start_time] + ([record.start_time] if record else [])
    outcome = [OutcomeEntry(rank=o.rank, pid=o.pid, status=o.status, exit_code=o.exit_code,
                           signal=o.signal, time=o.time) for o in (record.ranks if record else [])]
    if alive:
        state = "running"
    elif record is not None and not record.end_time and record.ended:
        state = "orphaned"  # the agent died without closing the record
    else:
        state = "ended"
    hosts = {e.host for e in ranks} | ({record.host} if record else set())
    return JobEntry(
        job_id=job, world_size=max([e.world_size for e in ranks] + [record.world_size if record else 0]),
        alive=len(alive), ranks=[e.rank for e in alive], pids=[e.pid for e in alive],
        ports=[e.port for e in alive], hosts=sorted(hosts),
        start_time=min(starts) if starts else 0.0,
        state=state, end_time=record.end_time if record else 0.0,
        exit_code=record.exit_code if record else None, command=record.command if record else [],
        record_bytes=record.record_bytes if record else 0, outcome=outcome,
        outcome_text=_outcome_text(record, alive),
        metrics_url=record.metrics_url if record and not record.ended else "",
        scheduler_job=next((e.scheduler_job for e in ranks if e.scheduler_job), ""),
        job_name=next((e.job_name for e in ranks if e.job_name), ""),
    )


def _outcome_text(record: JobRecord | None, alive: list[discovery.Endpoint]) -> str:
    if record is None:
        return f"running: ranks {rank_ranges(e.rank for e in alive)}" if alive else "no record"
    counts = Counter(o.status for o in record.ranks)
    parts: list[str] = []
    for o in sorted(record.ranks, key=lambda o: (o.time or float("inf"), o.rank)):
        if o.status in (Status.CRASHED, Status.TERMINATED, Status.LOST) and len(parts) < 3:
            how = o.signal or (f"exit {o.exit_code}" if o.exit_code is not None else "")
            parts.append(f"rank {o.rank} {o.status}" + (f" ({how})" if how else ""))
    for status in (Status.TORN_DOWN, Status.EXITED, Status.RUNNING):
        if counts[status]:
            parts.append(f"{counts[status]} {status.replace('_', ' ')}")
    return ", ".join(parts) or "no rank seen"

