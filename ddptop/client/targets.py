"""Resolve what the user named (nothing, a job id, HOST:PORT) into rank endpoints.

* nothing: the only job with live ranks on this host, else the job whose ranks ended last
  (its record closed or still being closed by its node agent);
* a job id (or a unique prefix of one): that job's discovery entries on this host, live or ended
  (an ended job is read from the black-box recording its node agent kept);
* HOST:PORT: the job's TCPStore (MASTER_ADDR:MASTER_PORT), where every rank of every
  node published its endpoint. Reading it needs torch on the viewer's machine.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from ddptop.client import agents, host_jobs
from ddptop.errors import TargetNotFound, UsageError
from ddptop.store import discovery, jobrecord
from ddptop.store.discovery import Endpoint
from ddptop.store.jobrecord import JobRecord

_HOST_PORT = re.compile(r"^(?P<host>\[[^\]]+\]|[^:]+):(?P<port>\d{1,5})$")


@dataclass
class JobTarget:
    """A job's reachable endpoints, and the ranks whose process is already gone."""

    job_id: str
    world_size: int
    endpoints: list[Endpoint]
    dead: list[Endpoint] = field(default_factory=list)
    record: Path | None = None  # the job's black-box record directory, when its agent kept one
    via_agents: bool = False  # reach ranks through their node agents (see client.agents)

    @property
    def ended(self) -> bool:
        """True when no rank is alive and only the recording can tell about the job."""
        return not self.endpoints and self.record is not None

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks of the world that have no discovery entry at all."""
        known = {e.rank for e in self.endpoints} | {e.rank for e in self.dead}
        return [r for r in range(self.world_size) if r not in known]


SLURM_SCHEME = "slurm:"
STORE_FILL_TIMEOUT_S = 2.0  # reading the job's store for the ranks of other hosts, at most


def resolve(target: str | None, store_timeout_s: float = 5.0) -> JobTarget:
    """Turn a target string into a JobTarget; TargetNotFound with a reason otherwise."""
    if target and target.startswith(SLURM_SCHEME):
        # SLURM's name: "slurm:12345" is every step of job 12345 ("12345." as a prefix, so it
        # never matches job 123456), "slurm:12345.0" that step.
        job = target[len(SLURM_SCHEME):]
        target = job if "." in job else job + "."
    elif target and _HOST_PORT.match(target):
        return _from_store(target, store_timeout_s)
    found = host_jobs.scan()
    live = found.live
    if target is None:
        if not live:
            return _latest_ended(found)
        if len(live) > 1:
            raise TargetNotFound(
                f"{len(live)} jobs run on this host ({', '.join(sorted(live))}); name one"
            )
        target = next(iter(live))
    matches = [job for job in live if job == target] or [j for j in live if j.startswith(target)]
    if not matches:
        return _ended(target, found)
    if len(matches) > 1:
        raise TargetNotFound(f"job id {target!r} is ambiguous: {', '.join(sorted(matches))}")
    job_id = matches[0]
    found.use(job_id)
    alive = {e.rank: e for e in live[job_id]}
    dead = [e for e in found.every.get(job_id, []) if e.rank not in alive]
    made = _job(job_id, sorted(alive.values(), key=lambda e: e.rank), dead)
    if made.missing_ranks:
        _add_from_store(made, min(store_timeout_s, STORE_FILL_TIMEOUT_S))
    return made


def _job(job_id: str, alive: list[Endpoint], dead: list[Endpoint],
         record: JobRecord | None = None) -> JobTarget:
    world = max([e.world_size for e in alive + dead] + [record.world_size if record else 0])
    if record is None:
        record = jobrecord.read_record(job_id) if discovery.is_safe_job_id(job_id) else None
        if host_jobs.record_of_earlier_job(record, alive):
            record = None  # an earlier job's black box: nothing of this one
    directory = jobrecord.job_dir(job_id) if record is not None else None
    return JobTarget(job_id=job_id, world_size=world, endpoints=alive, dead=dead, record=directory,
                     via_agents=agents.via_agents(remote=False))


def _add_from_store(made: JobTarget, timeout_s: float) -> None:
    """The ranks of other hosts, from the job's TCPStore that this host's ranks name: a job
    started without node agents (``srun python train.py``) is then seen whole from any node.
    Nothing is added when the store cannot be read (the ranks stay without a discovery entry here)."""
    stores = [e.store for e in made.endpoints if e.store]
    match = _HOST_PORT.match(stores[0]) if stores else None
    if match is None:
        return
    copied = copied_store(made.job_id, stores[0], made.endpoints)
    try:
        world, published = copied or read_store(match.group("host").strip("[]"), int(match.group("port")),
                                                timeout_s)
    except Exception:
        return  # the store is gone or unreachable: what this host has is the answer
    missing = set(made.missing_ranks)
    others = [e for e in published if e.rank in missing and e.job_id == made.job_id]
    made.endpoints = sorted(made.endpoints + others, key=lambda e: e.rank)
    made.world_size = max(made.world_size, world)
    if others:  # a job of several hosts: watched as one named by its store is (DDPTOP_VIA)
        made.via_agents = agents.via_agents(remote=True)


def _ended(target: str, found: host_jobs.HostJobs) -> JobTarget:
    """A job whose ranks are all gone: its recording, else whatever its ranks left behind."""
    records = {r.job_id: r for r in jobrecord.list_records()}
    stale = found.every
    # A job whose live ranks run in another network namespace is not the ended job of its id
    # that our directory remembers (#49): the viewer says where to look instead.
    names = (set(records) | set(stale)) - (set(found.other_network) & set(found.earlier))
    matches = [target] if target in names else sorted(j for j in names if j.startswith(target))
    if not matches:
        raise TargetNotFound(f"no job {target!r} on this host, running or ended "
                             f"({host_jobs.where_we_looked(found, target)}; see `ddptop jobs --all`)")
    if len(matches) > 1:
        raise TargetNotFound(f"job id {target!r} is ambiguous: {', '.join(matches)}")
    job_id = matches[0]
    found.use(job_id)
    return _job(job_id, [], stale.get(job_id, []), records.get(job_id))


def _latest_ended(found: host_jobs.HostJobs) -> JobTarget:
    """The job whose ranks ended last on this host (#54): no rank of any job is alive here,
    so a record whose agent is still closing it (srun just returned, the agent is reading its
    ranks' ends) is that of a job that has just ended, and it is the one asked about, not the
    job closed before it."""
    # A job whose ranks run in another network namespace is alive, not ended: where_we_looked says so.
    records = [r for r in jobrecord.list_records() if r.ended or r.job_id not in found.other_network]
    if not records:
        raise TargetNotFound(
            f"no ddptop job is running on this host ({host_jobs.where_we_looked(found)}); "
            "start one with `ddptop launch -- torchrun ...`"
        )
    last = max(records, key=lambda r: (last_heard(r), r.job_id))
    closing = "" if last.ended else " (its node agent is still closing its record)"
    print(f"ddptop: no job is running here; job {last.job_id} ended last{closing}: reading its recording",
          file=sys.stderr)
    stale = found.every.get(last.job_id, [])
    return _job(last.job_id, [], stale, last)


def last_heard(record: JobRecord) -> float:
    """When *record*'s job last did something this host's agent wrote down: its end, its last
    rank's exit, else its start (a job that began after another closed ended after it too)."""
    return max([record.end_time, record.start_time] + [r.time for r in record.ranks])


def copied_store(job_id: str, store: str, live: list[Endpoint]) -> tuple[int, list[Endpoint]] | None:
    """The world size and every endpoint of *job_id*, as this host's node agent copied them from
    its store at *store* (``store.json``), where the copy names this host's *live* ranks as they
    are (a restart makes new endpoints: then the store is read again); None otherwise."""
    copy = jobrecord.read_store_copy(job_id) if discovery.is_safe_job_id(job_id) else None
    if copy is None or copy[0] != store:
        return None
    _store, world, endpoints = copy
    by_rank = {e.rank: e for e in endpoints if e.job_id == job_id}
    if len(by_rank) < world or any((by_rank[e.rank].pid, by_rank[e.rank].port) != (e.pid, e.port)
                                   for e in live if e.rank in by_rank):
        return None
    return world, [by_rank[r] for r in sorted(by_rank)]


def _from_local_copy(target: str) -> JobTarget | None:
    """The job published at *target* ("MASTER_ADDR:PORT") where this host runs live ranks of it
    and its node agent kept the store's copy: no torch to import, no store to ask."""
    found = host_jobs.scan(elsewhere=False)
    for job_id, live in sorted(found.live.items()):
        if any(e.store == target for e in live) and (copied := copied_store(job_id, target, live)):
            world, published = copied
            mine = {e.rank for e in live}
            every = live + [e for e in published if e.rank not in mine]
            made = _job(job_id, sorted(every, key=lambda e: e.rank), [])
            made.world_size = max(made.world_size, world)
            made.via_agents = agents.via_agents(remote=True)
            return made
    return None


def _from_store(target: str, timeout_s: float) -> JobTarget:
    local = _from_local_copy(target)
    if local is not None:
        return local
    match = _HOST_PORT.match(target)
    assert match is not None
    host, port = match.group("host").strip("[]"), int(match.group("port"))
    try:
        world, endpoints = read_store(host, port, timeout_s)
    except UsageError:
        raise
    except Exception as exc:
        raise TargetNotFound(f"no ddptop job published at {target}: {exc}") from None
    if not endpoints:
        raise TargetNotFound(f"no ddptop rank published at {target}")
    # This host's node agent's record of the job, where it ran some of its ranks: what that
    # agent saw before this viewer began (a host whose beats stopped: since when) is in it.
    made = _job(endpoints[0].job_id, endpoints, [])
    made.world_size = max(made.world_size, world)
    made.via_agents = agents.via_agents(remote=True)
    return made


def read_store(host: str, port: int, timeout_s: float) -> tuple[int, list[Endpoint]]:
    """The world size and every endpoint published in the job's TCPStore at *host*:*port*
    (UsageError without torch; the store's own exception if it cannot be read)."""
    # c10d's C++ warnings ("the hostname of the client socket cannot be retrieved", printed
    # wherever hostnames do not resolve) and its errors with their C++ frames (a store that
    # cannot be reached: the exception says it, and a viewer says it in one line) would break
    # a viewer's output; read once, when torch is first imported. A user's own setting wins.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise UsageError(
            "reading a job's TCPStore (HOST:PORT) needs torch on this machine; "
            "name a job id on the rank's host instead"
        ) from None
    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s),
                     wait_for_workers=False)
    store.set_timeout(timedelta(seconds=timeout_s))
    world = int(store.get(discovery.STORE_WORLD_KEY))
    keys = [discovery.STORE_KEY_PREFIX + str(r) for r in range(world)]
    found = [k for k in keys if store.check([k])]
    return world, [Endpoint.from_json(store.get(k)) for k in found]
