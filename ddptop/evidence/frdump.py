"""Read one Flight Recorder dump (pickle or JSON, any version, any backend) into a RankDump.

What NCCL's watchdog writes on a timeout (``TORCH_FR_DUMP_TEMP_FILE<rank>``) and what
``_dump_fr_trace()`` / ``_dump_fr_trace_json()`` return. Fields come and go between FR
versions (``nccl_version`` became ``comm_lib_version``; ``p2p_seq_id``, ``is_p2p``,
``thread_id``, ``duration_ms`` appeared); JSON dumps carry no frames and 0 for an unknown
time. The file is data: read with a cap, unpickled by :mod:`ddptop.evidence.safe_pickle`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ddptop.errors import EvidenceError
from ddptop.evidence import pickle_tail, safe_pickle
from ddptop.evidence.types import FrGroup, FrOp, FrProgress, RankDump
from ddptop.protocol import FrameStack
from ddptop.store.remains import read_bounded

MAX_DUMP_BYTES = 256 << 20
MAX_ENTRIES = 1 << 20
KEEP_PER_GROUP = 64  # entries kept per group: twice what a rank's last words carry
_RANK_IN_NAME = re.compile(r"(\d{1,7})(?:\.(?:json|pkl|pickle|bin))?$")
_P2P = re.compile(r"\b(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)")
T = TypeVar("T")
_KEYS = (b"pg_config", b"entries", b"pg_status", b"comm_lib_version", b"nccl_version")


def looks_like_fr_dump(head: bytes) -> bool:
    """True if the first bytes of a file are those of an FR dump (pickle or JSON)."""
    if head[:1] == b"\x80":  # a pickle: FR's keys show among the first strings
        return any(key in head for key in _KEYS)
    stripped = head.lstrip()
    return stripped[:1] == b"{" and any(b'"' + key + b'"' in stripped for key in _KEYS)


def read_dump(path: str | os.PathLike[str], max_bytes: int = MAX_DUMP_BYTES) -> RankDump:
    """The dump at *path*, normalised; EvidenceError (one line naming the file) if unusable."""
    p = Path(path)
    try:
        info = os.lstat(p)
        if info.st_size > max_bytes:  # refused before anything is read
            raise EvidenceError(f"{p}: {info.st_size} bytes, over the {max_bytes >> 20} MiB cap for a dump")
        data, size = read_bounded(p, max_bytes + 1, tail=False)
    except OSError as exc:
        raise EvidenceError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if size > max_bytes:  # it grew meanwhile
        raise EvidenceError(f"{p}: {size} bytes, over the {max_bytes >> 20} MiB cap for a dump")
    mtime = info.st_mtime
    try:
        raw, fmt = _decode(data)
        return normalise(raw, path=str(p), fmt=fmt, mtime=mtime)
    except EvidenceError as exc:
        raise EvidenceError(f"{p}: {exc}") from None


class _JsonDump(msgspec.Struct):
    """A JSON dump's top level, its entries left as raw bytes: only each group's last ones are
    decoded (decoding all of them was 90% of reading a 2000-entry dump)."""

    entries: list[msgspec.Raw] = []
    version: Any = None
    pg_config: Any = None
    pg_status: Any = None
    comm_lib_version: Any = None
    nccl_version: Any = None
    rank: Any = None
    hostname: Any = None
    host: Any = None


class _EntryGroup(msgspec.Struct):
    """The one thing read from every entry: which group it belongs to."""

    process_group: Any = None
    pg_id: Any = None


_json_dump = msgspec.json.Decoder(_JsonDump)
_entry_group = msgspec.json.Decoder(_EntryGroup)


def _decode(data: bytes, keep_per_group: int = KEEP_PER_GROUP) -> tuple[dict[str, Any], str]:
    if data[:1] == b"\x80":
        raw: Any = _decode_pickle_tail(data, keep_per_group) or safe_pickle.loads(data)
        fmt = "pickle"
    else:
        fmt = "json"
        try:
            raw = _decode_json_tail(data, keep_per_group)
        except msgspec.ValidationError:  # an odd shape: the whole file, untyped, for normalise to judge
            raw = None
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:
            raise EvidenceError(f"not a readable JSON dump ({str(exc)[:80]})") from None
        if raw is None:
            try:
                raw = msgspec.json.decode(data)
            except (msgspec.DecodeError, ValueError, RecursionError) as exc:
                raise EvidenceError(f"not a readable JSON dump ({str(exc)[:80]})") from None
    if not isinstance(raw, dict):
        raise EvidenceError("not a Flight Recorder dump (no dict at the top)")
    return raw, fmt


def _decode_json_tail(data: bytes, keep: int) -> dict[str, Any] | None:
    """A JSON dump with only each group's last *keep* entries decoded; ``_entries_total`` says
    how many it held."""
    top = _json_dump.decode(data)
    if len(top.entries) > MAX_ENTRIES:
        raise EvidenceError(f"{len(top.entries)} entries, over the cap of {MAX_ENTRIES}")

    def group_of(chunk: msgspec.Raw) -> Any:
        try:
            return _group_key(_entry_group.decode(chunk))
        except msgspec.ValidationError:
            return _NOT_AN_ENTRY

    names = _group_names(top.pg_config, top.pg_status)
    kept = [msgspec.json.decode(c) for c in _last_per_group(top.entries, keep, group_of, names)]
    raw = {f: getattr(top, f) for f in top.__struct_fields__ if f != "entries"}
    raw = {k: v for k, v in raw.items() if v is not None}
    return {**raw, "entries": kept, "_entries_total": len(top.entries)}


_NOT_AN_ENTRY = object()


def _decode_pickle_tail(data: bytes, keep: int) -> dict[str, Any] | None:
    """A pickled dump with only its newest entries unpickled (:mod:`pickle_tail`): enough of
    them that every group has its last *keep*; twice as many each time that is not enough or
    not exact (a string the newest fetch was first written further back); None: all of it."""
    reader = pickle_tail.TailReader(data)
    if reader.total > MAX_ENTRIES:
        raise EvidenceError(f"{reader.total} entries, over the cap of {MAX_ENTRIES}")
    wanted = _group_names(reader.top.get("pg_config"), reader.top.get("pg_status"))
    count = keep * max(1, len(wanted))
    while wanted and count < reader.total:
        entries = reader.last(count)
        seen: dict[str, int] = {}
        for entry in entries or []:
            name = _pg_name(_dict_group(entry))
            seen[name] = seen.get(name, 0) + 1
        if entries is not None and all(seen.get(g, 0) >= keep for g in wanted):
            return {**reader.top, "entries": entries, "_entries_total": reader.total}
        count *= 2
    return None


def _dict_group(entry: Any) -> Any:
    if not isinstance(entry, dict):
        return _NOT_AN_ENTRY
    return _group_key(_EntryGroup(process_group=entry.get("process_group"), pg_id=entry.get("pg_id")))


def _group_names(config: Any, status: Any) -> set[str]:
    """Every group a dump names: pg_config's (gloo lists only the default group there) and
    pg_status's (every group with a collective)."""
    return {_pg_name(k) for part in (config, status) if isinstance(part, dict) for k in part}


def _last_per_group(entries: list[T], keep: int, group_of: Callable[[T], Any], wanted: set[str]) -> list[T]:
    """The last *keep* entries of every group, in record order. Walks back from the newest
    and stops once every group of *wanted* (:func:`_group_names`) has its share, so the cost follows
    *keep*, not the ring buffer's size."""
    counts: dict[Any, int] = {}
    full: set[str] = set()
    out: list[T] = []
    for entry in reversed(entries):
        if wanted and full >= wanted:
            break
        key = group_of(entry)
        if key is _NOT_AN_ENTRY:
            continue
        seen = counts.get(key, 0)
        if seen < keep:
            counts[key] = seen + 1
            out.append(entry)
            if seen + 1 == keep:
                full.add(_pg_name(key))
    out.reverse()
    return out


def _names_by_id(entries: list[Any]) -> dict[str, str]:
    """Each group's name by the id the process gave it: ``pg_status`` is keyed by that id (the
    rank's own count of its groups: 1, 2, 3...), the entries by the group's name (``5`` for the
    job's sixth group): reading the keys as names put a rank in groups it is not in (seen in
    torch 2.13's gloo dumps of an 8-rank job with tp/ep/dp groups)."""
    out: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, dict) and (pg_id := entry.get("pg_id")) is not None:
            group = entry.get("process_group")
            if isinstance(group, list | tuple) and group:
                out.setdefault(_pg_name(pg_id), _pg_name(group[0]))
    return out


def _group_key(entry: _EntryGroup) -> Any:
    group = entry.process_group
    key = group[0] if isinstance(group, list | tuple) and group else entry.pg_id
    return key if isinstance(key, str | int) else repr(key)[:64]


def normalise(raw: dict[str, Any], *, path: str, fmt: str, mtime: float = 0.0,
              keep_per_group: int = KEEP_PER_GROUP) -> RankDump:
    """A decoded dump as a RankDump (every shape and version), with each group's last
    *keep_per_group* entries: all a post-mortem compares, at a fraction of the cost."""
    entries_raw = raw.get("entries") or []
    if not isinstance(entries_raw, list):
        raise EvidenceError("entries is not a list")
    if len(entries_raw) > MAX_ENTRIES:
        raise EvidenceError(f"{len(entries_raw)} entries, over the cap of {MAX_ENTRIES}")
    warnings: list[str] = []
    total = raw.get("_entries_total")
    total = total if isinstance(total, int) else len(entries_raw)
    kept = _last_per_group(entries_raw, keep_per_group, _dict_group,
                           _group_names(raw.get("pg_config"), raw.get("pg_status")))
    entries = [op for op in (_op(e, warnings) for e in kept) if op is not None]
    groups = _groups(raw.get("pg_config"))
    names = _names_by_id(entries_raw)
    progress = {names.get(_pg_name(k), _pg_name(k)): FrProgress(
                    last_enqueued=_int(v.get("last_enqueued_collective")),
                                        last_started=_int(v.get("last_started_collective")),
                                        last_completed=_int(v.get("last_completed_collective")))
                for k, v in _dict(raw.get("pg_status")).items() if isinstance(v, dict)}
    times = [t for op in entries for t in (op.time_created, op.time_started or 0.0, op.time_completed or 0.0)]
    backends = {op.op.split(":", 1)[0] for op in entries if ":" in op.op}
    rank, host = _identity(path, raw)
    return RankDump(path=path, rank=rank, host=host, format=fmt, version=str(raw.get("version", "")),
                    comm_lib_version=str(raw.get("comm_lib_version") or raw.get("nccl_version") or ""),
                    backend=sorted(backends)[0] if len(backends) == 1 else ",".join(sorted(backends)),
                    groups=groups, progress=progress, entries=entries,
                    dump_time=_dump_time(max(times, default=0.0), mtime), entries_total=total,
                    warnings=warnings)


MTIME_TRUSTED_S = 3600.0


def _dump_time(newest: float, mtime: float) -> float:
    """When the dump was written: the file's mtime where it fits (at or after the newest op, by
    less than an hour: a copy without -p would stamp the copy's time), else the newest op."""
    if not newest:
        return mtime
    return mtime if newest <= mtime <= newest + MTIME_TRUSTED_S else newest


def _identity(path: str, raw: dict[str, Any]) -> tuple[int, str]:
    name = Path(path).name
    match = _RANK_IN_NAME.search(name)
    if "rank" in raw and isinstance(raw["rank"], int):
        rank = raw["rank"]
    elif match:
        rank = int(match.group(1))
    else:
        raise EvidenceError("no rank in the file name (expected <prefix><rank>)")
    host = str(raw.get("hostname") or raw.get("host") or "")
    return rank, host


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _pg_name(name: Any) -> str:
    # gloo names the default group '' in pg_config and '0' in its entries: one name.
    text = str(name)
    return "0" if text == "" else text


def _groups(config: Any) -> dict[str, FrGroup]:
    out: dict[str, FrGroup] = {}
    for key, value in _dict(config).items():
        if not isinstance(value, dict):
            continue
        name = _pg_name(value.get("name", key))
        out[name] = FrGroup(name=name, desc=str(value.get("desc", "")), ranks=_ranks(value.get("ranks")))
    return out


def _ranks(value: Any) -> list[int]:
    if isinstance(value, list):
        return [int(r) for r in value if isinstance(r, int | str) and str(r).lstrip("-").isdigit()]
    if isinstance(value, str):
        return [int(x) for x in re.findall(r"-?\d+", value[:1 << 20])]
    return []


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _seconds(ns: Any) -> float | None:
    if isinstance(ns, int | float) and not isinstance(ns, bool) and ns > 0:
        return float(ns) / 1e9
    if isinstance(ns, str) and ns.isdigit() and int(ns) > 0:
        return int(ns) / 1e9
    return None


def _shapes(value: Any) -> list[list[int]]:
    if not isinstance(value, list):
        return []
    return [[int(d) for d in shape if isinstance(d, int)]
            for shape in value if isinstance(shape, list | tuple)]


def _op(e: dict[str, Any], warnings: list[str]) -> FrOp | None:
    group = e.get("process_group")
    name = _pg_name(group[0]) if isinstance(group, list | tuple) and group else _pg_name(e.get("pg_id", ""))
    desc = str(group[1]) if isinstance(group, list | tuple) and len(group) > 1 else ""
    profiling = str(e.get("profiling_name", "?"))[:200]
    p2p = _P2P.search(profiling)
    # "send 0->1": this rank (0) sends to 1; "recv 0<-1": it receives from 1 (group-local ranks).
    peer = int(p2p.group(4)) if p2p else None
    frames = [FrameStack(file=str(f.get("filename", "?")), line=_int(f.get("line")) or 0,
                         function=str(f.get("name", "?")))
              for f in reversed(e.get("frames") or []) if isinstance(f, dict)]
    retired = bool(e.get("retired", False))
    return FrOp(
        record_id=_int(e.get("record_id")) or 0, pg_name=name, pg_desc=desc,
        collective_seq=_int(e.get("collective_seq_id")) or 0, p2p_seq=_int(e.get("p2p_seq_id")) or 0,
        op=profiling, is_p2p=bool(e.get("is_p2p", bool(p2p))), peer=peer,
        input_sizes=_shapes(e.get("input_sizes")), output_sizes=_shapes(e.get("output_sizes")),
        input_dtypes=[str(d) for d in e.get("input_dtypes") or []],
        output_dtypes=[str(d) for d in e.get("output_dtypes") or []],
        state=str(e.get("state", "")), retired=retired,
        time_created=_seconds(e.get("time_created_ns")) or 0.0,
        time_started=_seconds(e.get("time_discovered_started_ns")),
        time_completed=_seconds(e.get("time_discovered_completed_ns")),
        duration_ms=e.get("duration_ms") if isinstance(e.get("duration_ms"), int | float) else None,
        timeout_ms=e.get("timeout_ms") if isinstance(e.get("timeout_ms"), int | float) else None,
        frames=frames)
