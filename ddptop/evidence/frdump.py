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
from pathlib import Path
from typing import Any

import msgspec

from ddptop.errors import EvidenceError
from ddptop.evidence import safe_pickle
from ddptop.evidence.types import FrGroup, FrOp, FrProgress, RankDump
from ddptop.protocol import FrameStack
from ddptop.remains import read_bounded

MAX_DUMP_BYTES = 256 << 20
MAX_ENTRIES = 1 << 20
KEEP_PER_GROUP = 64  # entries kept per group: twice what a rank's last words carry
_RANK_IN_NAME = re.compile(r"(\d{1,7})(?:\.(?:json|pkl|pickle|bin))?$")
_P2P = re.compile(r"\b(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)")
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


def _decode(data: bytes) -> tuple[dict[str, Any], str]:
    if data[:1] == b"\x80":
        raw: Any = safe_pickle.loads(data)
        fmt = "pickle"
    else:
        try:
            raw = msgspec.json.decode(data)  # untyped, in C: 3x json.loads on a 1 MB dump
        except (msgspec.DecodeError, ValueError, RecursionError) as exc:
            raise EvidenceError(f"not a readable JSON dump ({str(exc)[:80]})") from None
        fmt = "json"
    if not isinstance(raw, dict):
        raise EvidenceError("not a Flight Recorder dump (no dict at the top)")
    return raw, fmt


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
    kept = _last_per_group(entries_raw, keep_per_group)
    entries = [op for op in (_op(e, warnings) for e in kept) if op is not None]
    groups = _groups(raw.get("pg_config"))
    progress = {_pg_name(k): FrProgress(last_enqueued=_int(v.get("last_enqueued_collective")),
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
                    dump_time=_dump_time(max(times, default=0.0), mtime), entries_total=len(entries_raw),
                    warnings=warnings)


MTIME_TRUSTED_S = 3600.0


def _dump_time(newest: float, mtime: float) -> float:
    """When the dump was written: the file's mtime where it fits (at or after the newest op, by
    less than an hour: a copy without -p would stamp the copy's time), else the newest op."""
    if not newest:
        return mtime
    return mtime if newest <= mtime <= newest + MTIME_TRUSTED_S else newest


def _last_per_group(entries: list[Any], keep: int) -> list[dict[str, Any]]:
    """The last *keep* entries of every group, in record order (one cheap pass from the end)."""
    counts: dict[Any, int] = {}
    out: list[dict[str, Any]] = []
    for entry in reversed(entries):
        if not isinstance(entry, dict):
            continue
        group = entry.get("process_group")
        key = group[0] if isinstance(group, list | tuple) and group else entry.get("pg_id")
        key = key if isinstance(key, str | int) else repr(key)[:64]
        seen = counts.get(key, 0)
        if seen < keep:
            counts[key] = seen + 1
            out.append(entry)
    out.reverse()
    return out


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
