"""Reading this rank's Flight Recorder: the JSON dump, typed views of it, and what ddptop takes from it.

Used by the collective tracker (:mod:`ddptop.reporter.collectives`) and the rank's last
words. Only the fields ddptop uses are decoded; a dump that cannot be read is an empty one.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ddptop.protocol import PendingOp

_P2P_NAME = re.compile(r"\b(?:send|recv)\s+\d+\s*(?:->|<-)\s*(\d+)")


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
    p2p_seq_id: int = 0
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


def pending_from_fr(text: str, now: float) -> dict[str, list[PendingOp]]:
    """Parse an FR JSON dump into pending ops per group name, oldest first."""
    return pending_from_dump(decode_fr(text), now)


def pending_from_dump(dump: FrDump, now: float) -> dict[str, list[PendingOp]]:
    """Pending ops per group name, oldest first, from a decoded FR dump."""
    completed = {str(pg_id): st.last_completed_collective for pg_id, st in dump.pg_status.items()}
    out: dict[str, list[PendingOp]] = {}
    for entry in dump.entries:
        if entry.retired or entry.state == "completed":
            continue
        seq = entry.collective_seq_id
        if not entry.is_p2p and seq <= completed.get(str(entry.pg_id), -1):
            continue
        p2p = _P2P_NAME.search(entry.profiling_name) if entry.is_p2p else None
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
                # "nccl:send 0->1": this rank sends to 1; "recv 0<-1": receives from 1 (within the group)
                is_p2p=entry.is_p2p, p2p_seq=entry.p2p_seq_id, peer=int(p2p.group(2)) if p2p else None,
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
