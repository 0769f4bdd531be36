"""A job's record directory on this host, ``<runtime dir>/jobs/<job id>/``, and its job record.

The job record, ``job.json``, says what the job was and how each local rank ended (written by the node
agent at start, at every rank exit and at the end); beside it the agent's recording (see
:mod:`ddptop.agent.recording`). Ended jobs stay listed by ``ddptop jobs`` and readable by
``doctor``, ``replay`` and ``export`` until retention prunes them: oldest first, by age and
by the total size of all record directories (``DDPTOP_KEEP_DAYS``, ``DDPTOP_KEEP_MB``).

A job of several hosts also leaves ``store.json`` there: every rank's endpoint as the agent
read them from the job's TCPStore once all were published. A viewer on this host then needs
no store read of its own (the store's client is torch's: seconds to import, half a minute on
a busy machine) to see the whole job.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec

from ddptop.store import discovery, job_token
from ddptop.store.discovery import Endpoint, pid_alive, private_write

log = logging.getLogger(__name__)

JOBS_DIR = "jobs"
RECORD_DIR_ENV = "DDPTOP_RECORD_DIR"  # record directories elsewhere than the runtime dir (a bigger disk)
RECORD_FILE = "job.json"
MAX_RECORD_BYTES = 4 * 1024 * 1024  # a job.json is a few KB; anything huge is not ours
STORE_COPY_FILE = "store.json"
MAX_STORE_COPY_BYTES = 64 * 1024 * 1024  # ~350 bytes a rank: 32,768 ranks take 12 MB
DEFAULT_KEEP_DAYS = 7.0
DEFAULT_KEEP_MB = 1024.0


class RankOutcome(msgspec.Struct, kw_only=True):
    """How one local rank ended (``status`` is a :class:`ddptop.status.Status` word)."""

    rank: int
    pid: int
    status: str = "running"
    exit_code: int | None = None
    signal: str = ""
    time: float = 0.0  # wall clock of the exit
    reason: str = ""  # the rank's own last word (exception, "terminated by SIGTERM"...)


class JobRecord(msgspec.Struct, kw_only=True):
    """``job.json``: one job as seen by this host's agent."""

    job_id: str
    host: str
    command: list[str] = []
    agent_pid: int = 0
    start_time: float = 0.0
    end_time: float = 0.0  # 0 while the job runs
    exit_code: int | None = None  # the launched command's, once it ended
    world_size: int = 0
    ranks: list[RankOutcome] = []
    record_bytes: int = 0
    ddptop_version: str = ""
    record_errors: int = 0  # writes of the recording that failed (disk full...): what is there is whole
    record_note: str = ""  # why there is no recording, or the first write error
    metrics_url: str = ""  # where the agent serves Prometheus metrics while the job runs
    exchange: str = ""  # with which other node agents news was exchanged, who was lost, what was impossible

    @property
    def ended(self) -> bool:
        """True once the agent closed the job record, or died without closing it."""
        return bool(self.end_time) or not pid_alive(self.agent_pid)


def jobs_dir(create: bool = False) -> Path:
    """Where record directories live: ``$DDPTOP_RECORD_DIR``, else ``<runtime dir>/jobs`` (0700)."""
    explicit = os.environ.get(RECORD_DIR_ENV)
    path = Path(explicit) if explicit else discovery.runtime_dir(create=create) / JOBS_DIR
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        discovery.check_private_dir(path)
    return path


def job_dir(job_id: str, create: bool = False) -> Path:
    """One job's record directory."""
    if not discovery.is_safe_job_id(job_id):
        raise ValueError(f"not a job id: {job_id[:40]!r}")
    path = jobs_dir(create) / job_id
    if create:
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def write_record(record: JobRecord) -> None:
    """Write ``job.json`` atomically (never through a planted symlink)."""
    private_write(job_dir(record.job_id, create=True) / RECORD_FILE, msgspec.json.encode(record))


def read_record(job_id: str) -> JobRecord | None:
    """The job record of *job_id*, or None if there is none (or it is unreadable)."""
    try:
        return _read(job_dir(job_id) / RECORD_FILE)
    except ValueError:
        return None


def write_store_copy(job_id: str, store: str, world_size: int, endpoints: list[Endpoint]) -> None:
    """``store.json``: what the job's store at *store* ("MASTER_ADDR:PORT") held, every rank's
    endpoint (atomically, 0600)."""
    data = {"store": store, "world_size": world_size, "endpoints": [asdict(e) for e in endpoints]}
    private_write(job_dir(job_id, create=True) / STORE_COPY_FILE, json.dumps(data).encode())


def read_store_copy(job_id: str) -> tuple[str, int, list[Endpoint]] | None:
    """The store's address, the world size and the endpoints of *job_id*'s ``store.json``
    (None: there is none, or it cannot be read)."""
    try:
        data = discovery.private_read(job_dir(job_id) / STORE_COPY_FILE, MAX_STORE_COPY_BYTES)
        if data is None:
            return None
        copy = json.loads(data)
        endpoints = [Endpoint.from_json(json.dumps(e)) for e in copy["endpoints"]]
        return str(copy["store"]), int(copy["world_size"]), endpoints
    except (ValueError, KeyError, TypeError) as exc:
        log.debug("ignoring the unreadable store copy of %s: %s", job_id, exc)
        return None


def _read(path: Path) -> JobRecord | None:
    data = discovery.private_read(path, MAX_RECORD_BYTES)
    if data is None:
        return None
    try:
        return msgspec.json.decode(data, type=JobRecord)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.debug("ignoring unreadable job record %s: %s", path, exc)
        return None


def list_records() -> list[JobRecord]:
    """Every readable job record on this host, oldest first."""
    root = jobs_dir()
    if not root.is_dir():
        return []
    found: list[JobRecord] = []
    for path in root.iterdir():
        if not path.is_dir() or path.is_symlink() or not discovery.is_safe_job_id(path.name):
            continue
        record = _read(path / RECORD_FILE)
        if record is not None and record.job_id == path.name:  # a job record names its own directory
            found.append(record)
    return sorted(found, key=lambda r: (r.start_time, r.job_id))


def dir_bytes(path: Path) -> int:
    """Total size of the regular files directly in *path*."""
    total = 0
    try:
        for entry in os.scandir(path):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return total


@dataclass
class PruneResult:
    """What a prune removed."""

    removed: list[str]
    freed_bytes: int
    kept: int


def retention_from_env() -> tuple[float, float]:
    """(max age in seconds, max total bytes) from DDPTOP_KEEP_DAYS / DDPTOP_KEEP_MB."""
    def number(name: str, default: float) -> float:
        try:
            return max(0.0, float(os.environ.get(name, default)))
        except ValueError:
            return default
    return (number("DDPTOP_KEEP_DAYS", DEFAULT_KEEP_DAYS) * 86400.0,
            number("DDPTOP_KEEP_MB", DEFAULT_KEEP_MB) * 1024 * 1024)


def prune(max_age_s: float, max_total_bytes: float, now: float | None = None,
          keep: frozenset[str] = frozenset()) -> PruneResult:
    """Remove ended jobs older than *max_age_s*, then the oldest until the total fits.

    Running jobs and the ids in *keep* are never removed. A job's flat files in the
    runtime directory (its ranks' discovery, crash and last-words files) go with it.
    """
    now = time.time() if now is None else now
    records = [r for r in list_records() if r.job_id not in keep]
    ended = sorted((r for r in records if r.ended), key=lambda r: r.end_time or r.start_time)
    sizes = {r.job_id: dir_bytes(job_dir(r.job_id)) for r in records}
    total = sum(sizes.values())
    removed: list[str] = []
    freed = 0
    for record in ended:
        too_old = now - (record.end_time or record.start_time) > max_age_s
        if not too_old and total <= max_total_bytes:
            continue
        remove_job(record.job_id)
        removed.append(record.job_id)
        freed += sizes[record.job_id]
        total -= sizes[record.job_id]
    return PruneResult(removed=removed, freed_bytes=freed, kept=len(records) - len(removed))


def remove_job(job_id: str) -> None:
    """Delete a job's record directory and its ranks' files in the runtime directory."""
    shutil.rmtree(job_dir(job_id), ignore_errors=True)
    job_token.remove(job_id)
    root = discovery.runtime_dir(create=False)
    # <job>.<rank>.<suffix>, and never another job whose id merely starts with this one.
    mine = re.compile(re.escape(job_id) + r"\.\d+\.")
    for path in root.glob(f"{job_id}.*"):
        if mine.match(path.name) and not path.is_dir():
            path.unlink(missing_ok=True)
