"""Collective-op sequence numbers and the Flight Recorder, per process group.

The source of truth is c10d itself, not wrappers around ``dist.*`` (which are blind to
DDP's C++ bucketed all-reduce): ``pg._get_sequence_number_for_group()`` counts every
collective of the group, and the Flight Recorder lists the ops a rank entered.

Gloo and NCCL differ in what FR says: NCCL moves ``state`` through scheduled / started
/ completed, gloo leaves it at "scheduled" and keys ``pg_config`` by an empty name. So
"pending" here means: not retired, not completed, and beyond the group's
``last_completed_collective`` from ``pg_status``. This works for both.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ddptop.protocol import ENQUEUE_STRIDE, CollectiveGroup, PendingOp

log = logging.getLogger(__name__)

ENQUEUE_TIMES_KEPT = 64  # milestones per group sent to viewers (~1 KB)
# Seqs the default group must advance before the first timing read (enough milestones).
FIRST_TIMING_AFTER_SEQS = 8 * ENQUEUE_STRIDE
# Minimum spacing of Flight Recorder reads while a group is stalled (a dump of 2000
# entries costs milliseconds, so once per sample at most).
FR_REFRESH_S = 0.9


class CollectiveTracker:
    """Remembers when each group's seq last moved, and reads FR when it stalls."""

    def __init__(self, fr_after_s: float = 2.0, timing_every_s: float = 30.0) -> None:
        self.fr_after_s = fr_after_s
        # A full FR dump costs tens of ms with the GIL held: timing reads are rare (and
        # each one carries the enqueue times of up to 2000 past collectives).
        self.timing_every_s = timing_every_s
        self._last_seq: dict[str, tuple[int, float]] = {}
        self._pending: dict[str, list[PendingOp]] = {}
        self._last_fr_read = 0.0
        self._last_timing_read = 0.0
        self._milestones: dict[str, dict[int, float]] = {}
        self.backend = ""

    def groups(self, c10d: Any, now: float) -> list[CollectiveGroup]:
        """Read every group's seq; attach pending ops from FR when a group stalls."""
        world = c10d._world
        names = dict(world.pg_names)
        groups: list[CollectiveGroup] = []
        stalled = False
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
                stalled = stalled or (now - changed_at >= self.fr_after_s)
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
        read_pending = stalled and now - self._last_fr_read >= FR_REFRESH_S
        read_timing = self._timing_due(groups, now)
        if not stalled:
            self._pending = {}
        if read_pending or read_timing:
            # Re-read on every stalled sample (rate-limited): an op seen pending once may
            # complete while the rank then idles without a new collective, and a cached
            # list would keep reporting it with an ever-growing age.
            data = parse_fr(read_fr_json())
            if read_pending:
                self._last_fr_read = now
                self._pending = pending_from_parsed(data, now)
            if read_timing:
                self._last_timing_read = now
            self._remember_milestones(data)
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

    def _timing_due(self, groups: list[CollectiveGroup], now: float) -> bool:
        if self.timing_every_s <= 0 or not groups:
            return False
        default = next((g for g in groups if g.pg == "0"), groups[0])
        if not self._last_timing_read:
            return default.seq >= FIRST_TIMING_AFTER_SEQS
        return now - self._last_timing_read >= self.timing_every_s

    def _remember_milestones(self, data: dict[str, Any]) -> None:
        for name, marks in enqueue_milestones(data).items():
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


def read_fr_json() -> str:
    """Dump the Flight Recorder as JSON text ("" if unavailable in this torch)."""
    import torch

    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return ""
    try:
        raw = dump(includeCollectives=True, onlyActive=False)
    except TypeError:  # signatures differ between torch releases: take the defaults
        raw = dump()
    # torch returns bytes; str(bytes) would give "b'...'", which no JSON parser reads.
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else str(raw)


def parse_fr(text: str) -> dict[str, Any]:
    """An FR JSON dump as a dict ({} when empty or unreadable)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _group_name(entry: dict[str, Any]) -> str:
    group = entry.get("process_group") or [str(entry.get("pg_id", ""))]
    return str(group[0]) if group else str(entry.get("pg_id", ""))


def enqueue_milestones(data: dict[str, Any], stride: int = ENQUEUE_STRIDE) -> dict[str, dict[int, float]]:
    """Wall-clock enqueue time of every collective whose seq is a multiple of *stride*."""
    out: dict[str, dict[int, float]] = {}
    for entry in data.get("entries", []) or []:
        seq = int(entry.get("collective_seq_id", 0))
        created = float(entry.get("time_created_ns", 0)) / 1e9
        if entry.get("is_p2p") or seq <= 0 or seq % stride or not created:
            continue
        out.setdefault(_group_name(entry), {})[seq] = created
    return out


def pending_from_fr(text: str, now: float) -> dict[str, list[PendingOp]]:
    """Parse an FR JSON dump into pending ops per group name, oldest first."""
    return pending_from_parsed(parse_fr(text), now)


def pending_from_parsed(data: dict[str, Any], now: float) -> dict[str, list[PendingOp]]:
    """Pending ops per group name, oldest first, from a parsed FR dump."""
    status = data.get("pg_status", {}) or {}
    completed: dict[str, int] = {}
    for pg_id, st in status.items():
        try:
            completed[str(pg_id)] = int(st.get("last_completed_collective", -1))
        except (TypeError, ValueError):
            completed[str(pg_id)] = -1
    out: dict[str, list[PendingOp]] = {}
    for entry in data.get("entries", []) or []:
        if entry.get("is_p2p") or entry.get("retired") or entry.get("state") == "completed":
            continue
        seq = int(entry.get("collective_seq_id", 0))
        pg_id = str(entry.get("pg_id", ""))
        if seq <= completed.get(pg_id, -1):
            continue
        name = _group_name(entry)
        created = float(entry.get("time_created_ns", 0)) / 1e9
        timeout_ms = entry.get("timeout_ms")
        dtypes = entry.get("input_dtypes") or []
        out.setdefault(name, []).append(
            PendingOp(
                seq=seq,
                op=str(entry.get("profiling_name", "?")),
                sizes=[entry.get("input_sizes") or [], entry.get("output_sizes") or []],
                dtype=str(dtypes[0]) if dtypes else "",
                age_s=max(0.0, now - created) if created else 0.0,
                started_at=created,
                timeout_s=float(timeout_ms) / 1000 if timeout_ms else None,
                state=str(entry.get("state", "")),
            )
        )
    for ops in out.values():
        ops.sort(key=lambda op: op.seq)
    return out


RECENT_PER_GROUP = 32  # ops per group kept in last words: enough to span a step's collectives


def recent_from_parsed(data: dict[str, Any], per_group: int = RECENT_PER_GROUP) -> dict[str, list[PendingOp]]:
    """The last *per_group* collectives of each group in a parsed FR dump, oldest first.

    For the post-mortem: every rank's recent ops, compared by seq across ranks, show the
    first collective at which the ranks did different things.
    """
    out: dict[str, list[PendingOp]] = {}
    for entry in data.get("entries", []) or []:
        if entry.get("is_p2p"):
            continue
        seq = int(entry.get("collective_seq_id", 0))
        if seq <= 0:
            continue
        created = float(entry.get("time_created_ns", 0)) / 1e9
        dtypes = entry.get("input_dtypes") or []
        out.setdefault(_group_name(entry), []).append(PendingOp(
            seq=seq, op=str(entry.get("profiling_name", "?")),
            sizes=[entry.get("input_sizes") or [], entry.get("output_sizes") or []],
            dtype=str(dtypes[0]) if dtypes else "", started_at=created,
            state=str(entry.get("state", "")),
        ))
    for name, ops in out.items():
        ops.sort(key=lambda op: op.seq)
        out[name] = ops[-per_group:]
    return out
