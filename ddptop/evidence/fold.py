"""Fold evidence records into the events of a recording: one model, one diagnosis for all.

A folder of Flight Recorder dumps and torchrun's files becomes a :class:`Contents`, the
same value a recording or bundle reads into, so ``doctor``, ``replay`` and ``export`` take
it through the paths they already have (``build_model``, ``ReplaySource``, the bundle
writer). Each rank's dump becomes one ``RankState`` at the moment of its dump, its groups
carrying their members (global ranks), the last collectives and those still pending; a
rank's failure from torchrun's files becomes its last words and a ``RankExit``. Pure: no
file is opened here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import msgspec

from ddptop._version import __version__
from ddptop.bundle.format import SCHEMA_VERSION, Manifest
from ddptop.bundle.reader import Contents
from ddptop.evidence.types import FrGroup, FrOp, RankDump, RankFailure
from ddptop.protocol import (
    STUB_LOCAL_RANK,
    CollectiveGroup,
    Event,
    FrTraceMsg,
    PendingOp,
    RankExit,
    RankState,
    RecordEntry,
    StacksMsg,
    StateMsg,
    ThreadStack,
    Versions,
)
from ddptop.status import Status

RECENT_PER_GROUP = 32  # as in a rank's last words: enough to span a step's collectives
STACK_SOURCE = "flight_recorder"  # StacksMsg.source: where the rank's last op was enqueued
MAX_TRACE_JSON = 4 << 20  # the normalised dump kept per rank for replay and export


def fold_evidence(dumps: Iterable[RankDump], failures: Iterable[RankFailure], *, job_id: str,
                  path: str, warnings: Iterable[str] = (), world_size: int = 0,
                  base: Contents | None = None) -> Contents:
    """Every rank's dump and failure as the events of one recording of job *job_id*.

    With *base* (a recording of the same job: ddptop's black box), a rank the recording
    already knows keeps its last state, with the dump's groups and the failure's words
    added to it, so the dump adds what the 1 Hz samples could not see without erasing
    the step, the host and the exit the recording had. Where the recording's exit is
    unknown (the node agent saw the process go, reaped before its status could be read),
    torchrun's own account of that process (its exit code or signal) tells it.
    """
    by_rank: dict[int, RankDump] = {}
    for dump in sorted(dumps, key=lambda d: d.dump_time):
        by_rank[dump.rank] = dump  # a rank dumped twice: its newest dump tells most
    failed: dict[int, RankFailure] = {}
    for failure in failures:
        seen = failed.get(failure.rank)
        failed[failure.rank] = _merged(seen, failure) if seen else failure
    members = _members(by_rank.values())  # once: per rank it was quadratic (23 s at 1024 ranks)
    by_rank = {rank: _with_members(dump, members) for rank, dump in by_rank.items()}
    world = max([world_size, *(_world_of(d) for d in by_rank.values()),
                 *(r + 1 for r in (*by_rank, *failed))], default=0)
    known = _last_states(base) if base is not None else {}
    exits = _last_exits(base) if base is not None else {}
    if base is not None:
        world = max(world, base.manifest.world_size)
    events: list[Event] = list(base.events) if base is not None else []
    for rank in sorted(set(by_rank) | set(failed)):
        if rank in known:
            events += _added_to(known[rank], by_rank.get(rank), failed.get(rank))
            if rank in exits and rank in failed:
                events += exit_told(exits[rank], failed[rank])
        else:
            # A log alone proves no job size (its highest rank is a floor): its ranks say 0,
            # "unknown", so no rule takes the ranks it shows for the whole job.
            told = world if world_size or by_rank else 0
            events += _rank_events(rank, by_rank.get(rank), failed.get(rank), job_id, told)
    hosts = sorted({d.host for d in by_rank.values() if d.host} | {f.host for f in failed.values() if f.host})
    notes = f"{len(by_rank)} Flight Recorder dump(s), {len(failed)} failure record(s)"
    manifest = Manifest(schema_version=SCHEMA_VERSION, kind="bundle", created=time.time(), job_id=job_id,
                        world_size=world, ddptop_version=__version__, hosts=hosts,
                        unanswered={r: "left no dump" for r in range(world)
                                    if r not in by_rank and by_rank},
                        note=f"read from evidence files: {notes}")
    events.sort(key=lambda e: e.time)
    if base is not None:
        manifest = msgspec.structs.replace(base.manifest, world_size=world,
                                           hosts=sorted(set(base.manifest.hosts) | set(hosts)),
                                           note=f"{base.manifest.note}; with {notes}".strip("; "))
        return Contents(path=base.path, manifest=manifest, events=events, hosts=base.hosts,
                        crash_files=base.crash_files, findings=None, end=base.end,
                        warnings=[*base.warnings, *warnings])
    return Contents(path=Path(path), manifest=manifest, events=events, warnings=list(warnings))


def _last_states(contents: Contents) -> dict[int, RecordEntry]:
    out: dict[int, RecordEntry] = {}
    for event in contents.events:
        if isinstance(event, RecordEntry) and isinstance(event.message, StateMsg):
            known = out.get(event.rank)
            if known is None or event.time >= known.time:
                out[event.rank] = event
    return out


def _last_exits(contents: Contents) -> dict[int, RankExit]:
    out: dict[int, RankExit] = {}
    for event in contents.events:
        message = event.message if isinstance(event, RecordEntry) else event
        if isinstance(message, RankExit):
            out[message.rank] = message  # the events are in time order: the last one wins
    return out


def exit_told(exit: RankExit, failure: RankFailure) -> list[RankExit]:
    """The recorded *exit*, if its status is unknown, with the status torchrun's log gives
    for the same process (an exit after it, at the same time, so the model takes it). The
    node agent asks it too, as the job ends (``NodeAgent.finish``)."""
    if exit.exit_code is not None or exit.signal or (failure.exit_code is None and not failure.signal):
        return []
    if failure.pid and exit.pid and failure.pid != exit.pid:
        return []  # an earlier incarnation's failure (torchrun restarted the rank)
    return [msgspec.structs.replace(exit, exit_code=None if failure.signal else failure.exit_code,
                                    signal=failure.signal)]


def _added_to(last: RecordEntry, dump: RankDump | None, failure: RankFailure | None) -> list[Event]:
    """The recording's last state of a rank, with the dump's groups and the failure's words."""
    assert isinstance(last.message, StateMsg)
    state = last.message.state
    fields: dict[str, object] = {}
    when = last.time
    if dump is not None:
        from_dump = {g.pg: g for g in groups_of(dump)}
        merged = [_with_dump_group(g, from_dump.pop(g.pg)) if g.pg in from_dump else g
                  for g in state.collectives]
        fields["collectives"] = merged + list(from_dump.values())
        when = max(when, dump.dump_time)
    if failure is not None and failure.message and _says_less(state.exit_reason, failure.message):
        fields["exit_reason"] = failure.message
    if not fields:
        return []
    new = msgspec.structs.replace(state, **fields)
    out: list[Event] = [RecordEntry(time=when, rank=last.rank, message=StateMsg(state=new))]
    if dump is not None:
        out += _dump_extras(last.rank, dump)
    return out


def _says_less(reason: str, message: str) -> bool:
    """True when the rank's own last word says less than the log: nothing, or only the name of
    the signal that killed it ("Aborted"), where stderr has C++'s what() line."""
    return not reason or (len(reason) < 40 and ":" not in reason and "\n" not in reason and message != reason)


def _with_dump_group(live: CollectiveGroup, dumped: CollectiveGroup) -> CollectiveGroup:
    return msgspec.structs.replace(live, seq=max(live.seq, dumped.seq), ranks=dumped.ranks or live.ranks,
                                   recent=dumped.recent, pending=dumped.pending,
                                   last_completed=dumped.last_completed, size=live.size or dumped.size)


def _merged(a: RankFailure, b: RankFailure) -> RankFailure:
    """Two records of one rank's failure (log and error file): keep what each knows."""
    first, second = (a, b) if (a.traceback or a.message) else (b, a)
    return msgspec.structs.replace(
        first, time=first.time or second.time, message=first.message or second.message,
        traceback=first.traceback or second.traceback, pid=first.pid or second.pid,
        host=first.host or second.host,
        exit_code=first.exit_code if first.exit_code is not None else second.exit_code,
        signal=first.signal or second.signal, first=first.first or second.first)


def _members(dumps: Iterable[RankDump]) -> dict[str, list[int]]:
    """Each group's members as the dumps show them: a rank that has a group's status or ops
    belongs to it. Gloo's dumps name no members (pg_config holds one group '' with '[]'),
    and a rank keeps status only for the groups it is in."""
    out: dict[str, set[int]] = {}
    for dump in dumps:
        for name in {*dump.progress, *(op.pg_name for op in dump.entries)}:
            out.setdefault(name, set()).add(dump.rank)
    return {name: sorted(ranks) for name, ranks in out.items()}


def _with_members(dump: RankDump, seen: dict[str, list[int]]) -> RankDump:
    """*dump* with members filled in for the groups whose pg_config says nothing."""
    names = {*dump.groups, *dump.progress, *(op.pg_name for op in dump.entries)}
    groups = dict(dump.groups)
    changed = False
    for name in names:
        known = groups.get(name)
        if (known is None or not known.ranks) and seen.get(name):
            groups[name] = FrGroup(name=name, desc=known.desc if known else "", ranks=seen[name])
            changed = True
    return msgspec.structs.replace(dump, groups=groups) if changed else dump


def _world_of(dump: RankDump) -> int:
    default = dump.groups.get("0")
    sizes = [len(default.ranks)] if default is not None and default.ranks else []
    sizes += [max(g.ranks) + 1 for g in dump.groups.values() if g.ranks]
    return max(sizes, default=0)


def _rank_events(rank: int, dump: RankDump | None, failure: RankFailure | None, job_id: str,
                 world: int) -> list[Event]:
    t_dump = dump.dump_time if dump is not None else 0.0
    t_fail = failure.time if failure is not None else 0.0
    when = t_dump or t_fail or 0.0
    state = RankState(rank=rank, local_rank=STUB_LOCAL_RANK, world_size=world, host=_host(dump, failure),
                      pid=(failure.pid if failure is not None and failure.pid else 0), job_id=job_id,
                      status=Status.STALE, time=when)
    if dump is not None:
        state.backend = dump.backend
        state.collectives = groups_of(dump)
        state.versions = Versions(nccl=dump.comm_lib_version or None, ddptop="")
    events: list[Event] = []
    if failure is not None and not failure.failed:
        state.exit_reason = failure.message  # where it was: its status stays what a dump says
    elif failure is not None:
        state.status = Status.CRASHED
        state.exit_reason = failure.message or (f"died of {failure.signal}" if failure.signal else "")
        state.time = max(when, t_fail)
        if failure.exit_code is not None or failure.signal:
            events.append(RankExit(time=t_fail or when, rank=rank, pid=failure.pid or 0, host=state.host,
                                   exit_code=None if failure.signal else failure.exit_code,
                                   signal=failure.signal))
    events.append(RecordEntry(time=state.time, rank=rank, message=StateMsg(state=state)))
    if dump is not None:
        events += _dump_extras(rank, dump)
    return events


def _host(dump: RankDump | None, failure: RankFailure | None) -> str:
    return (dump.host if dump is not None else "") or (failure.host if failure is not None else "")


def groups_of(dump: RankDump) -> list[CollectiveGroup]:
    """One ``CollectiveGroup`` per process group the dump names, with its last ops."""
    ops_of: dict[str, list[FrOp]] = {}
    for op in sorted(dump.entries, key=lambda e: e.record_id):
        ops_of.setdefault(op.pg_name, []).append(op)
    names = sorted(set(dump.groups) | set(ops_of), key=_group_order)
    out: list[CollectiveGroup] = []
    for name in names:
        info = dump.groups.get(name)
        members = list(info.ranks) if info is not None else []
        ops = ops_of.get(name, [])
        progress = dump.progress.get(name)
        done = [op.collective_seq for op in ops if _completed(op) and not op.is_p2p]
        last_completed = progress.last_completed if progress is not None else None
        if last_completed is None and done:
            last_completed = max(done)
        entered = [op.collective_seq for op in ops if not op.is_p2p]
        seq = max(entered, default=0)
        if progress is not None and progress.last_enqueued is not None:
            seq = max(seq, progress.last_enqueued)
        recent = [_pending_op(op, members, dump.dump_time) for op in ops[-RECENT_PER_GROUP:]]
        pending = [p for p, op in zip(recent, ops[-RECENT_PER_GROUP:], strict=True)
                   if not _completed(op) and (op.is_p2p or last_completed is None
                                              or op.collective_seq > last_completed)]
        group = CollectiveGroup(
            pg=name, seq=seq, desc=(info.desc if info is not None and info.desc else "")
            or (ops[0].pg_desc if ops else ""),  # gloo's pg_config names no subgroup: its entries do
            size=len(members), backend=dump.backend, ranks=members, last_completed=last_completed,
            recent=recent, pending=pending, seq_changed_at=max((op.time_created for op in ops), default=0.0))
        if pending and pending[0].timeout_s is not None:
            group.timeout_s = pending[0].timeout_s
        out.append(group)
    return out


def _group_order(name: str) -> tuple[int, int, str]:
    # The default group first, then numbered groups in order, then named ones.
    return (0 if name == "0" else 1, int(name) if name.isdigit() else 1 << 30, name)


def _completed(op: FrOp) -> bool:
    return op.state == "completed" or op.retired


def _pending_op(op: FrOp, members: list[int], dumped_at: float) -> PendingOp:
    peer = None
    if op.peer is not None:
        peer = members[op.peer] if 0 <= op.peer < len(members) else (op.peer if not members else None)
    return PendingOp(
        seq=op.collective_seq, op=op.op, sizes=[op.input_sizes, op.output_sizes],
        dtype=op.input_dtypes[0] if op.input_dtypes else "", started_at=op.time_created,
        age_s=max(0.0, dumped_at - op.time_created) if op.time_created and not _completed(op) else 0.0,
        timeout_s=op.timeout_ms / 1000 if op.timeout_ms else None,
        state="completed" if _completed(op) else (op.state or "scheduled"),
        is_p2p=op.is_p2p, p2p_seq=op.p2p_seq, peer=peer)


def _dump_extras(rank: int, dump: RankDump) -> list[Event]:
    """The dump itself (normalised JSON, for replay and export) and where its last op was enqueued."""
    when = dump.dump_time
    text = msgspec.json.encode(dump).decode()
    trace = FrTraceMsg(rank=rank, time=when, json=text if len(text) <= MAX_TRACE_JSON else "",
                       error="" if len(text) <= MAX_TRACE_JSON else f"dump of {len(text)} bytes not kept")
    out: list[Event] = [RecordEntry(time=when, rank=rank, message=trace)]
    last = next((op for op in reversed(dump.entries) if op.frames), None)
    if last is not None:
        label = f"enqueued {last.op} #{last.collective_seq or last.p2p_seq} (group {last.pg_name})"
        stack = ThreadStack(thread_id=0, name=label, frames=list(last.frames), is_main=True)
        out.append(RecordEntry(time=when, rank=rank,
                               message=StacksMsg(rank=rank, time=when, threads=[stack], source=STACK_SOURCE)))
    return out
