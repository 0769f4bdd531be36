"""What a node agent's digest carries of each rank, and how a viewer puts a state back together.

A node agent that serves a viewer in "digest" mode (:class:`~ddptop.protocol.NodeDigest`)
does not forward every state: each field of :class:`~ddptop.protocol.RankState` is in
exactly one class, kept here as data so that a new field cannot go unclassified (a test
fails) and the docs, the agent and the viewer read one table:

* **pulse** (:data:`PULSE_FIELDS`): the numbers that move at every sample and that a rule or
  a table column reads. Sent for every sample of every rank heard, exact.
* **detail** (:data:`DETAIL_FIELDS`): identity, configuration, status, endings, group
  structure, which collectives are pending. :func:`detail_key` is their value; when it
  changes the whole state goes out in that interval's digest, exact as of the interval.
* **on demand** (:data:`ON_DEMAND_FIELDS`): read by no rule and no table column (the rank
  detail screen shows some). Exact as of the rank's last detail; ``Request(state, ranks=…)``
  refreshes them.

Paths name a field inside ``RankState``: ``gpu.util_percent``, ``collectives[].seq`` (every
group), ``collectives[pg=0].enqueue_times`` (the default group only), ``load_avg[0]``. A
field split between two classes appears once per part.

Pure: imports the protocol, msgspec and the standard library only (a room beside ``wire``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from msgspec.structs import replace

from ddptop.protocol import (
    CollectiveGroup,
    GpuInfo,
    HistoryMsg,
    LoaderInfo,
    PendingOp,
    Pulse,
    RankState,
    RecordEntry,
    Sample,
    StateMsg,
)

__all__ = [
    "CONTAINERS", "DETAIL_FIELDS", "ON_DEMAND_FIELDS", "PULSE_FIELDS", "PulseBatch", "detail_key",
    "last_enqueue_seq", "leaf_of", "merged", "pulse_of",
]

DEFAULT_PG = "0"  # the group whose enqueue milestones the lateness rule reads (lateness.py)

PULSE_FIELDS: frozenset[str] = frozenset((
    # the history Sample (the rate rules, the sparklines)
    "time", "step", "epoch", "batch", "step_time_s", "data_wait_fraction", "loader_ready_batches",
    "cpu_percent", "rss_bytes", "gpu.util_percent",
    # table columns and rule evidence beside the sample
    "gpu.mem_used_bytes", "shm_used_bytes", "load_avg[0]", "last_step_at",
    # the resource trends (rules_resources): in the sample
    "cgroup_memory_bytes", "disk_used_bytes",
    # LAG-SEQ and collective_stall without a Flight Recorder: every group
    "collectives[].seq", "collectives[].seq_changed_at",
    # how long each pending op has waited (the ops themselves are detail)
    "collectives[].pending[].age_s",
    # lateness.entry_lateness reads the default group's milestones only
    "collectives[pg=0].enqueue_times",
))

DETAIL_FIELDS: frozenset[str] = frozenset((
    # identity and incarnation
    "rank", "local_rank", "world_size", "host", "pid", "job_id", "start_time", "restart_count",
    "status",
    # configuration
    "batches_per_epoch", "loader_workers", "backend", "cpu_count", "shm_total_bytes",
    "gpu.index", "gpu.name", "gpu.compute_capability", "gpu.mem_total_bytes", "gpu.p2p",
    # identity checks across ranks
    "versions", "param_fingerprint", "rng_fingerprint",
    # endings (the rank's words, and what the agent saw from outside)
    "crash_file", "exit_reason", "exit_code", "exit_signal", "exited_at", "exit_cause",
    "memory_limit_bytes", "memory_peak_bytes", "worker_crashes", "stuck",
    # the limits the resource trends are judged against, and who shares them
    "mem_total_bytes", "cgroup_path", "cgroup_memory_limit_bytes", "disk_path", "disk_mount",
    "disk_total_bytes", "disk_levels",
    # where a rank that makes no progress is in the user's code (changes when it moves)
    "where",
    # group structure
    "collectives[].pg", "collectives[].desc", "collectives[].size", "collectives[].backend",
    "collectives[].timeout_s", "collectives[].ranks", "collectives[].last_completed",
    "collectives[].enqueued",
    "collectives[].recent",
    # a collective entered or left: the pending ops' identity
    "collectives[].pending[].seq", "collectives[].pending[].op", "collectives[].pending[].sizes",
    "collectives[].pending[].dtype", "collectives[].pending[].state",
    "collectives[].pending[].timeout_s", "collectives[].pending[].started_at",
    "collectives[].pending[].is_p2p", "collectives[].pending[].p2p_seq", "collectives[].pending[].peer",
    # loaders as _unequal_train / _unequal_eval compare them
    "loaders[].index", "loaders[].name", "loaders[].role", "loaders[].length", "loaders[].batch_size",
    "loaders[].workers",
))

ON_DEMAND_FIELDS: frozenset[str] = frozenset((
    "env", "reporter", "threads", "mem_available_bytes", "loader_worker_pids", "last_batch_at",
    "gpu_reserved_bytes",
    "load_avg[1:]",
    "gpu.temperature_c", "gpu.power_w", "gpu.uuid", "gpu.driver",
    # LoaderInfo.batch is read by _extra_eval_batch only for an aborted rank, whose final
    # state always comes whole and at once.
    "loaders[].batch", "loaders[].passes", "loaders[].passes_completed", "loaders[].steps",
    "loaders[].ready_batches", "loaders[].last_batch_at", "loaders[].worker_pids", "loaders[].rebuilt",
    "collectives[pg!=0].enqueue_times",
))

# Fields that hold other classified structs: the classes name their parts, not them. Their
# shape (a GPU or none, how many groups and in which order, how many pending ops and loaders,
# how long load_avg is) is part of the detail key, so a pulse always fits its detail.
CONTAINERS: dict[str, type] = {
    "gpu": GpuInfo, "collectives[]": CollectiveGroup, "collectives[].pending[]": PendingOp,
    "loaders[]": LoaderInfo,
}

_SELECTOR = re.compile(r"\[[^\]]+\]")


def leaf_of(path: str) -> str:
    """The struct field a class entry is (part of): ``collectives[pg=0].enqueue_times`` is
    ``collectives[].enqueue_times``, ``load_avg[0]`` is ``load_avg``."""
    path = _SELECTOR.sub("[]", path)
    return path[:-2] if path.endswith("[]") else path


def _op_key(op: PendingOp) -> tuple[Any, ...]:
    return (op.seq, op.op, op.sizes, op.dtype, op.state, op.timeout_s, op.started_at, op.is_p2p,
            op.p2p_seq, op.peer)


def _group_key(g: CollectiveGroup) -> tuple[Any, ...]:
    # Lists are compared by value, not copied: a group's ranks may be thousands long.
    return (g.pg, g.desc, g.size, g.backend, g.timeout_s, g.ranks, g.last_completed, g.enqueued, g.recent,
            tuple(map(_op_key, g.pending)) if g.pending else ())


def _loader_key(i: LoaderInfo) -> tuple[Any, ...]:
    return (i.index, i.name, i.role, i.length, i.batch_size, i.workers)


def detail_key(s: RankState) -> tuple[Any, ...]:
    """The value of every detail field (and the containers' shapes): a rank whose key did not
    change since the viewer's copy needs only pulses. Compared with ``==``, never hashed."""
    gpu = s.gpu
    gpu_key = None if gpu is None else (gpu.index, gpu.name, gpu.compute_capability, gpu.mem_total_bytes,
                                        gpu.p2p)
    return (
        s.rank, s.local_rank, s.world_size, s.host, s.pid, s.job_id, s.start_time, s.restart_count,
        s.status, s.batches_per_epoch, s.loader_workers, s.backend, s.cpu_count, s.shm_total_bytes,
        gpu_key, s.versions, s.param_fingerprint, s.rng_fingerprint, s.crash_file, s.exit_reason,
        s.exit_code, s.exit_signal, s.exited_at, s.exit_cause, s.memory_limit_bytes, s.memory_peak_bytes,
        s.worker_crashes, s.stuck, s.where, len(s.load_avg),
        s.mem_total_bytes, s.cgroup_path, s.cgroup_memory_limit_bytes, s.disk_path, s.disk_mount,
        s.disk_total_bytes, s.disk_levels,
        # map, not generator expressions: an agent keys every state of its ranks (and the
        # synthetic job's 4,096 agents 32,768 a second): 3.4 -> 2.1 us a running state, 4.6 -> 3.3 us
        # one waiting in a collective (its pending op).
        tuple(map(_group_key, s.collectives)),
        tuple(map(_loader_key, s.loaders)) if s.loaders else (),
    )


def _default_group(s: RankState) -> CollectiveGroup | None:
    # A loop, not next() over a generator: twice a state in an agent's lane, 0.6 us less each.
    for g in s.collectives:
        if g.pg == DEFAULT_PG:
            return g
    return None


def last_enqueue_seq(s: RankState) -> int:
    """The newest enqueue milestone of the default group (-1: none): where the next pulse's
    ``enqueued`` starts."""
    g = _default_group(s)
    return g.enqueue_times[-1][0] if g is not None and g.enqueue_times else -1


def pulse_of(s: RankState, heard_ago: float, after_seq: int = -1, detail_no: int = 0) -> Pulse:
    """*s*'s pulse fields; the default group's milestones newer than *after_seq* only."""
    g0 = _default_group(s)
    enq = g0.enqueue_times if g0 is not None else []
    return Pulse(
        rank=s.rank, heard_ago=heard_ago, sample=Sample.of(s, s.time),
        seqs=[g.seq for g in s.collectives], seq_changed_at=[g.seq_changed_at for g in s.collectives],
        last_step_at=s.last_step_at,
        gpu_mem_used_bytes=s.gpu.mem_used_bytes if s.gpu is not None else None,
        shm_used_bytes=s.shm_used_bytes, load1=s.load_avg[0] if s.load_avg else None,
        pending_ages=[op.age_s for g in s.collectives for op in g.pending],
        enqueued=[e for e in enq if e[0] > after_seq], enqueue_kept=len(enq), detail_no=detail_no,
    )


Milestones = list[tuple[int, float]]


def _milestones(old: Milestones, new: Milestones, kept: int) -> Milestones:
    if new:
        first = new[0][0]
        old = [e for e in old if e[0] < first] + new
    return old[-kept:] if kept else []


def merged(base: RankState, pulse: Pulse) -> RankState:
    """*base* (the rank's last detail, or the last merge) moved to *pulse*'s sample: a new
    state, *base* untouched (a viewer's model may share it). Exact on every pulse and detail
    field when *base* has the pulse's detail key and the milestones up to its predecessor."""
    p, sample = pulse, pulse.sample
    ages = iter(p.pending_ages)
    groups: list[CollectiveGroup] = []
    g0 = _default_group(base)
    for i, g in enumerate(base.collectives):
        pending = [replace(op, age_s=next(ages, op.age_s)) for op in g.pending] if g.pending else g.pending
        enq = g.enqueue_times
        if g is g0:
            enq = _milestones(enq, p.enqueued, p.enqueue_kept)
        groups.append(replace(
            g, seq=p.seqs[i] if i < len(p.seqs) else g.seq,
            seq_changed_at=p.seq_changed_at[i] if i < len(p.seq_changed_at) else g.seq_changed_at,
            pending=pending, enqueue_times=enq))
    gpu = base.gpu
    if gpu is not None:
        gpu = replace(gpu, util_percent=sample.gpu_util_percent, mem_used_bytes=p.gpu_mem_used_bytes)
    load_avg = [p.load1, *base.load_avg[1:]] if p.load1 is not None else base.load_avg
    return replace(
        base, time=sample.time, step=sample.step, epoch=sample.epoch, batch=sample.batch,
        step_time_s=sample.step_time_s, data_wait_fraction=sample.data_wait_fraction,
        loader_ready_batches=sample.loader_ready_batches, cpu_percent=sample.cpu_percent,
        rss_bytes=sample.rss_bytes, last_step_at=p.last_step_at, shm_used_bytes=p.shm_used_bytes,
        load_avg=load_avg, gpu=gpu, collectives=groups,
        cgroup_memory_bytes=sample.cgroup_memory_bytes, disk_used_bytes=sample.disk_used_bytes,
    )


def with_milestones(pulse: Pulse, since_detail: Milestones) -> Milestones:
    """The default group's milestones every pulse since the rank's detail brought (*since_detail*,
    then *pulse*'s), set as *pulse*'s own: :func:`merged` of the detail and this one pulse is
    then the state the whole chain of pulses gives (milestones are in seq order; each pulse
    carries only those newer than its predecessor's)."""
    if pulse.enqueued:
        since_detail = _milestones(since_detail, pulse.enqueued, pulse.enqueue_kept)
    pulse.enqueued = since_detail
    return since_detail


@dataclass(slots=True)
class PulseBatch:
    """One node digest's pulses, each with the detail it lies on: an event from a live source
    to a :class:`~ddptop.model.job.JobModel`, never on the wire and never recorded as is.

    The model keeps a rank's newest (detail, pulse) and merges them only when something reads
    the state (:func:`merged` costs ~25 us; a 32,768-rank job sends 16,384 pulses a second, each
    rank's every two seconds, and the table shows fifty). ``times[i]`` is when pulse *i*'s
    state was heard, on the viewer's clock. :meth:`entries` gives what a subscriber would have
    received, for consumers that keep events (a recorder, a test)."""

    times: list[float]
    details: list[RankState]
    pulses: list[Pulse]

    def entries(self) -> list[RecordEntry]:
        """Each pulse as the whole state it stands for, as a subscriber's ``RecordEntry``; the
        samples it carried from before it as a history of them, first."""
        out: list[RecordEntry] = []
        for t, d, p in zip(self.times, self.details, self.pulses, strict=True):
            if p.earlier:
                earlier = HistoryMsg(rank=p.rank, samples=p.earlier)
                out.append(RecordEntry(time=t, rank=p.rank, message=earlier))
            out.append(RecordEntry(time=t, rank=p.rank, message=StateMsg(state=merged(d, p))))
        return out
