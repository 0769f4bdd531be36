"""Collective-op sequence numbers and the Flight Recorder, per process group.

The source of truth is c10d itself, not wrappers around ``dist.*`` (which are blind to
DDP's C++ bucketed all-reduce): ``pg._get_sequence_number_for_group()`` counts every
collective of the group, and the Flight Recorder lists the ops a rank entered.

Gloo and NCCL differ in what FR says: NCCL moves ``state`` through scheduled / started
/ completed, gloo leaves it at "scheduled" and keys ``pg_config`` by an empty name. So
"pending" here means: not retired, not completed, and beyond the group's
``last_completed_collective`` from ``pg_status``. This works for both.

Cost: a full FR dump (2000 entries) holds the GIL for ~40-60 ms on this machine; a
status-only dump (``includeCollectives=False``: each group's last enqueued / completed
seq) costs ~20 us. So a stalled group is first checked with the status dump, and the
full dump is read only when a stalled group has an op enqueued and not completed that
the last full read did not see, at most ``FR_FULL_READS_PER_MIN`` times a minute
whatever the number of groups. An idle group (everything it enqueued completed) never
triggers a full read. Full dumps are decoded with typed msgspec structs (only the
fields used), and enqueue milestones are taken only from entries not seen before.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import msgspec

from ddptop.protocol import ENQUEUE_STRIDE, CollectiveGroup, PendingOp

ENQUEUE_TIMES_KEPT = 64  # milestones per group sent to viewers (~1 KB)
# Seqs the default group must advance before the first timing read (enough milestones).
FIRST_TIMING_AFTER_SEQS = 8 * ENQUEUE_STRIDE
# Full FR dumps per minute at most, pending and timing reads together.
FR_FULL_READS_PER_MIN = 6
# Re-read spacing while stalled when this torch's FR has no per-group status.
FR_STATUSLESS_REFRESH_S = 10.0


class CollectiveTracker:
    """Remembers when each group's seq last moved, and reads FR when one stalls."""

    def __init__(self, fr_after_s: float = 2.0, timing_every_s: float = 30.0,
                 full_reads_per_min: int = FR_FULL_READS_PER_MIN) -> None:
        self.fr_after_s = fr_after_s
        # A full FR dump costs tens of ms with the GIL held: timing reads are rare (and
        # each one carries the enqueue times of up to 2000 past collectives).
        self.timing_every_s = timing_every_s
        self.full_reads_per_min = full_reads_per_min
        self._last_seq: dict[str, tuple[int, float]] = {}
        self._pending: dict[str, list[PendingOp]] = {}
        self._seen_enqueued: dict[str, int] = {}  # FR pg_id -> last enqueued at the last full read
        self._full_reads: deque[float] = deque()  # times of full reads in the last minute
        self._last_full_read = 0.0
        self._last_timing_read = 0.0
        self._last_record_id = -1  # FR entries up to this one were taken for milestones
        self._pg_ids: dict[str, str] = {}  # group name -> FR pg_id (learned from entries)
        self._milestones: dict[str, dict[int, float]] = {}
        self.backend = ""
        self.status_reads = 0
        self.full_reads = 0

    def groups(self, c10d: Any, now: float) -> list[CollectiveGroup]:
        """Read every group's seq; attach pending ops from FR when a group stalls."""
        world = c10d._world
        names = dict(world.pg_names)
        groups: list[CollectiveGroup] = []
        stalled: list[str] = []
        for pg, entry in list(world.pg_map.items()):
            try:
                seq = int(pg._get_sequence_number_for_group())
            except Exception:  # a group that is not ready yet
                continue
            name = _group_id(pg, names)
            last = self._last_seq.get(name)
            if last is None or last[0] != seq:
                self._last_seq[name] = (seq, now)
                self._pending.pop(name, None)
                changed_at = now
            else:
                changed_at = last[1]
                if now - changed_at >= self.fr_after_s:
                    stalled.append(name)
            backend = str(entry[0]) if isinstance(entry, tuple) and entry else ""
            if name == "0" or not self.backend:
                self.backend = self.backend or backend
            groups.append(
                CollectiveGroup(
                    pg=name,
                    seq=seq,
                    desc=str(getattr(pg, "group_desc", "") or names.get(pg, "")),
                    size=int(pg.size()),
                    backend=backend,
                    seq_changed_at=changed_at,
                )
            )
        read_pending = bool(stalled) and self._pending_read_due(stalled, now)
        if not stalled:
            self._pending = {}
        read_timing = self._timing_due(groups, now)
        if (read_pending or read_timing) and self._full_read_allowed(now):
            dump = decode_fr(read_fr_json(backend=self.backend))
            self._remember_pg_ids(dump)
            if read_pending:
                self._pending = pending_from_dump(dump, now)
                self._seen_enqueued = {pg_id: st.last_enqueued_collective
                                       for pg_id, st in dump.pg_status.items()}
            if read_timing:
                self._last_timing_read = now
            self._remember_milestones(dump)
        for group in groups:
            pending = self._pending.get(group.pg, [])
            # Only ops at or beyond the group's seq can be pending: an op the seq moved
            # past was followed by another, and FR entries may lag behind.
            group.pending = [op for op in pending if op.seq >= group.seq]
            for op in group.pending:
                if op.started_at:
                    op.age_s = max(0.0, now - op.started_at)
            if group.pending and group.pending[0].timeout_s is not None:
                group.timeout_s = group.pending[0].timeout_s
            marks = self._milestones.get(group.pg)
            if marks:
                group.enqueue_times = sorted(marks.items())[-ENQUEUE_TIMES_KEPT:]
        return groups

    def _pending_read_due(self, stalled: list[str], now: float) -> bool:
        """Whether a stalled group has an op in flight that the last full read did not see.

        Asks FR's per-group status (cheap); forgets cached pending ops that have
        completed since (an idle rank's seq never moves again, so only FR can tell).
        """
        status = decode_fr(read_fr_json(include_collectives=False, backend=self.backend)).pg_status
        self.status_reads += 1
        if not status:  # no per-group status in this torch: re-read, slowly
            return now - self._last_full_read >= FR_STATUSLESS_REFRESH_S
        due = False
        for name in stalled:
            st = status.get(self._pg_ids.get(name, name))
            if st is None:
                continue
            kept = [op for op in self._pending.get(name, []) if op.seq > st.last_completed_collective]
            if kept:
                self._pending[name] = kept
            else:
                self._pending.pop(name, None)
            pg_id = self._pg_ids.get(name, name)
            if st.last_enqueued_collective > st.last_completed_collective and \
                    st.last_enqueued_collective > self._seen_enqueued.get(pg_id, -1):
                due = True
        return due

    def _full_read_allowed(self, now: float) -> bool:
        """At most ``full_reads_per_min`` full dumps in any minute (counted when granted)."""
        while self._full_reads and now - self._full_reads[0] >= 60.0:
            self._full_reads.popleft()
        if len(self._full_reads) >= self.full_reads_per_min:
            return False
        self._full_reads.append(now)
        self._last_full_read = now
        self.full_reads += 1
        return True

    def _timing_due(self, groups: list[CollectiveGroup], now: float) -> bool:
        if self.timing_every_s <= 0 or not groups:
            return False
        default = next((g for g in groups if g.pg == "0"), groups[0])
        if not self._last_timing_read:
            return default.seq >= FIRST_TIMING_AFTER_SEQS
        return now - self._last_timing_read >= self.timing_every_s

    def _remember_pg_ids(self, dump: FrDump) -> None:
        for entry in dump.entries:
            if entry.process_group:
                self._pg_ids[str(entry.process_group[0])] = str(entry.pg_id)

    def _remember_milestones(self, dump: FrDump) -> None:
        fresh = [e for e in dump.entries if e.record_id > self._last_record_id]
        if dump.entries:
            self._last_record_id = max(self._last_record_id, max(e.record_id for e in dump.entries))
        for name, marks in milestones_of(fresh).items():
            kept = self._milestones.setdefault(name, {})
            kept.update(marks)
            if len(kept) > ENQUEUE_TIMES_KEPT:
                for seq in sorted(kept)[:-ENQUEUE_TIMES_KEPT]:
                    del kept[seq]


def _group_id(pg: Any, names: dict[Any, str]) -> str:
    # FR identifies groups by pg_id / the name c10d gave them ("0", "1", ...).
    try:
        return str(pg.group_name)
    except Exception:
        return str(names.get(pg, "?"))


def read_fr_json(include_collectives: bool = True, backend: str = "") -> str:
    """Dump the Flight Recorder as JSON text ("" if unavailable in this torch).

    Without collectives the dump holds only each group's status (last enqueued /
    started / completed seq): microseconds instead of tens of milliseconds. NCCL's groups
    record into a recorder of their own (CUDA events), dumped by ``_dump_nccl_trace_json``;
    ``_dump_fr_trace_json`` holds the CPU backends' (gloo). Seen on an H100 with torch 2.11:
    the generic dump of a NCCL job was empty, so no pending op was ever shown.
    """
    import torch

    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_nccl_trace_json", None) if "nccl" in backend else None
    dump = dump or getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return ""
    try:
        raw = dump(includeCollectives=include_collectives, onlyActive=False)
    except TypeError:  # signatures differ between torch releases: take the defaults
        raw = dump()
    # torch returns bytes; str(bytes) would give "b'...'", which no JSON parser reads.
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else str(raw)


# Typed views of an FR dump: only the fields ddptop uses are decoded (msgspec skips the
# rest), lax about numbers given as strings (pg_status has "3000").


class FrEntry(msgspec.Struct, gc=False):
    """One FR entry (a collective or p2p op this rank enqueued)."""

    record_id: int = -1
    collective_seq_id: int = 0
    pg_id: int | str = ""
    process_group: list[str] = []
    profiling_name: str = "?"
    state: str = ""
    retired: bool = False
    is_p2p: bool = False
    time_created_ns: int | float = 0
    timeout_ms: int | float | None = None
    input_sizes: list[Any] | None = None
    output_sizes: list[Any] | None = None
    input_dtypes: list[str] | None = None


class FrPgStatus(msgspec.Struct, gc=False):
    """A group's progress as FR counts it."""

    last_enqueued_collective: int = -1
    last_completed_collective: int = -1


class FrDump(msgspec.Struct, gc=False):
    """The parts of an FR dump ddptop reads."""

    entries: list[FrEntry] = []
    pg_status: dict[str, FrPgStatus] = {}


def decode_fr(text: str | bytes) -> FrDump:
    """An FR JSON dump, typed (empty when missing or unreadable)."""
    if not text:
        return FrDump()
    try:
        return msgspec.json.decode(text, type=FrDump, strict=False)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return FrDump()


def _group_name(entry: FrEntry) -> str:
    return str(entry.process_group[0]) if entry.process_group else str(entry.pg_id)


def milestones_of(entries: list[FrEntry], stride: int = ENQUEUE_STRIDE) -> dict[str, dict[int, float]]:
    """Wall-clock enqueue time of every collective whose seq is a multiple of *stride*."""
    out: dict[str, dict[int, float]] = {}
    for entry in entries:
        seq = entry.collective_seq_id
        created = float(entry.time_created_ns) / 1e9
        if entry.is_p2p or seq <= 0 or seq % stride or not created:
            continue
        out.setdefault(_group_name(entry), {})[seq] = created
    return out


def enqueue_milestones(text: str, stride: int = ENQUEUE_STRIDE) -> dict[str, dict[int, float]]:
    """Milestones (see :func:`milestones_of`) of an FR JSON dump."""
    return milestones_of(decode_fr(text).entries, stride)


def pending_from_fr(text: str, now: float) -> dict[str, list[PendingOp]]:
    """Parse an FR JSON dump into pending ops per group name, oldest first."""
    return pending_from_dump(decode_fr(text), now)


def pending_from_dump(dump: FrDump, now: float) -> dict[str, list[PendingOp]]:
    """Pending ops per group name, oldest first, from a decoded FR dump."""
    completed = {str(pg_id): st.last_completed_collective for pg_id, st in dump.pg_status.items()}
    out: dict[str, list[PendingOp]] = {}
    for entry in dump.entries:
        if entry.is_p2p or entry.retired or entry.state == "completed":
            continue
        seq = entry.collective_seq_id
        if seq <= completed.get(str(entry.pg_id), -1):
            continue
        created = float(entry.time_created_ns) / 1e9
        timeout_ms = entry.timeout_ms
        dtypes = entry.input_dtypes or []
        out.setdefault(_group_name(entry), []).append(
            PendingOp(
                seq=seq,
                op=entry.profiling_name,
                sizes=[entry.input_sizes or [], entry.output_sizes or []],
                dtype=str(dtypes[0]) if dtypes else "",
                age_s=max(0.0, now - created) if created else 0.0,
                started_at=created,
                timeout_s=float(timeout_ms) / 1000 if timeout_ms else None,
                state=entry.state,
            )
        )
    for ops in out.values():
        ops.sort(key=lambda op: op.seq)
    return out


RECENT_PER_GROUP = 32  # ops per group kept in last words: enough to span a step's collectives


def recent_ops(dump: FrDump, per_group: int = RECENT_PER_GROUP) -> dict[str, list[PendingOp]]:
    """The last *per_group* collectives of each group in a decoded FR dump, oldest first.

    For the post-mortem: every rank's recent ops, compared by seq across ranks, show the
    first collective at which the ranks did different things.
    """
    out: dict[str, list[PendingOp]] = {}
    for entry in dump.entries:
        seq = entry.collective_seq_id
        if entry.is_p2p or seq <= 0:
            continue
        dtypes = entry.input_dtypes or []
        out.setdefault(_group_name(entry), []).append(PendingOp(
            seq=seq, op=entry.profiling_name,
            sizes=[entry.input_sizes or [], entry.output_sizes or []],
            dtype=str(dtypes[0]) if dtypes else "", started_at=float(entry.time_created_ns) / 1e9,
            state=entry.state,
        ))
    for name, ops in out.items():
        ops.sort(key=lambda op: op.seq)
        out[name] = ops[-per_group:]
    return out
