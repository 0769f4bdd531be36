"""Typed, normalised records of evidence files: one shape whatever the file's version.

A Flight Recorder dump (pickle or JSON, FR 2.2 to today, any backend) becomes a
:class:`RankDump`; torchrun's log and torchelastic's error files become
:class:`RankFailure` records. Times are epoch seconds (0.0 where unknown).
"""

from __future__ import annotations

import msgspec

from ddptop.protocol import FrameStack


class FrOp(msgspec.Struct, gc=False, kw_only=True):
    """One Flight Recorder entry (a collective or p2p op the rank enqueued), normalised."""

    record_id: int  # per-process counter: order within one dump, never matched across ranks
    pg_name: str  # the group's name (pg_config key, process_group[0]); the default group is "0"
    pg_desc: str = ""
    collective_seq: int = 0  # collective_seq_id
    p2p_seq: int = 0  # p2p_seq_id (FR >= 2.4), 0 where absent
    op: str = "?"  # profiling_name as written: "nccl:all_reduce", "gloo:broadcast", "nccl:send 0->1"
    is_p2p: bool = False
    peer: int | None = None  # p2p: the *group-local* rank at the other end, from the name
    input_sizes: list[list[int]] = []
    output_sizes: list[list[int]] = []
    input_dtypes: list[str] = []
    output_dtypes: list[str] = []
    state: str = ""  # scheduled / started / completed (gloo: a retired entry is "completed")
    retired: bool = False
    time_created: float = 0.0
    time_started: float | None = None
    time_completed: float | None = None
    duration_ms: float | None = None
    timeout_ms: float | None = None
    frames: list[FrameStack] = []  # innermost last, like a traceback


class FrGroup(msgspec.Struct, gc=False, kw_only=True):
    """A process group as the dump's pg_config names it."""

    name: str
    desc: str = ""
    ranks: list[int] = []  # global ranks, empty where the dump does not say


class FrProgress(msgspec.Struct, gc=False, kw_only=True):
    """pg_status: a group's progress as FR counts it (None where the dump does not say)."""

    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


class RankDump(msgspec.Struct, gc=False, kw_only=True):
    """One rank's Flight Recorder dump, read safely and normalised."""

    path: str
    rank: int  # global rank: the trailing number of the file name, else what the dump says
    host: str = ""  # from the file name where it carries one
    format: str = ""  # "pickle" / "json"
    version: str = ""  # FR schema version ("2.9")
    comm_lib_version: str = ""  # nccl_version / comm_lib_version
    backend: str = ""  # "nccl", "gloo", "rccl", "xccl", "hccl", "ncclx"... from the op names
    groups: dict[str, FrGroup] = {}
    progress: dict[str, FrProgress] = {}
    entries: list[FrOp] = []  # in record order: each group's last ones (see entries_total)
    entries_total: int = 0  # entries the dump held
    dump_time: float = 0.0  # the newest time in the dump, else the file's mtime
    warnings: list[str] = []


class RankFailure(msgspec.Struct, gc=False, kw_only=True):
    """What torchrun's log or torchelastic's error file says of one rank's failure."""

    rank: int
    source: str  # the file it was read from
    host: str = ""
    pid: int | None = None
    time: float = 0.0  # when it failed (error file timestamp, log time stamp), 0.0 unknown
    message: str = ""  # the exception's own last line: "RuntimeError: CUDA error: ..."
    traceback: list[str] = []  # the traceback lines, capped
    exit_code: int | None = None
    signal: str = ""  # "SIGSEGV" where torchrun says the rank died of a signal
    first: bool = False  # torchelastic names this rank the root cause ("first failure")
    failed: bool = True  # False: the log only tells where the rank was (a trace line), not that it failed
