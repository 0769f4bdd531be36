"""A finding: what the diagnosis saw, on which ranks, why (numbers), and what to do.

``kind`` is a public vocabulary (see ``KINDS``); the JSON of ``ddptop doctor --json`` is
``{"findings": [Finding, ...]}`` with these field names.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Severity = Literal["info", "warning", "critical"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}

KINDS: frozenset[str] = frozenset((
    "unequal_batches", "collective_mismatch", "collective_stall", "straggler", "input_bound",
    "cpu_oversubscribed", "shm_pressure", "rank_lost", "param_mismatch", "version_mismatch",
    "gpu_heterogeneous", "rng_divergence", "unequal_eval_batches",
    "rank_unresponsive", "node_lost", "host_unreachable",
    "collective_deadlock",  # added with the wait-for graph (#45)
    "memory_exhaustion", "shm_exhaustion", "disk_exhaustion",  # resources heading for a limit (#48)
    "no_culprit",  # a log understood, no one blamed: what was recognised and why (#54)
))


class WaitEdge(msgspec.Struct, kw_only=True):
    """Ranks blocked in one op, and whom they wait for there (the wait-for graph's edges)."""

    ranks: list[int]
    waits_for: list[int]  # empty: members the evidence cannot name
    op: str  # "gloo:all_reduce #128 of group 1 mesh_replicate (ranks 0,2)", "gloo:recv from rank 2"


class Forecast(msgspec.Struct, kw_only=True):
    """A resource heading for its limit: the numbers behind an ``*_exhaustion`` finding."""

    resource: str  # "cgroup memory", "host memory", "GPU memory", "/dev/shm", "disk"
    where: str  # what holds the limit: the cgroup's path, the host, "host:gpu0", the mount point
    used_bytes: int  # the newest peak
    limit_bytes: int
    rate_bytes_per_s: float  # the floor's rise (the per-step sawtooth left out)
    eta_s: float  # seconds from ``at`` to the limit at that rate
    at: float  # wall clock of the newest sample the forecast read
    reaches_at: float  # wall clock the limit is reached: at + eta_s
    shared_by: list[int] = []  # every rank that shares the limit
    # Growth in steps (#55: checkpoints): one save's size, their spacing, how many more fit;
    # null for a smooth trend. ``reaches_at`` is then when the first save that does not fit is due.
    step_bytes: int | None = None
    step_every_s: float | None = None
    steps_fit: int | None = None


class Finding(msgspec.Struct, kw_only=True):
    """One diagnosed problem."""

    kind: str
    severity: Severity
    ranks: list[int]
    title: str  # one line a person reads
    evidence: list[str] = []  # the numbers that prove it
    remedy: str = ""  # what to change
    since: float | None = None  # wall clock the condition was first seen, when known
    step: int | None = None  # the culprit's optimizer step when it happened, when known
    # Added in 0.1.0's desync work (#33); older readers ignore them:
    certain: bool = True  # False: the evidence cannot tell which of ``ranks`` is the cause ("cannot tell")
    victims: list[int] = []  # ranks that failed or waited *because of* the cause: never the cause
    # Added with the wait-for graph (#45): what each victim waits in and for whom, one entry per
    # class of victims blocked alike (a handful even at 32,768 ranks)
    waits: list[WaitEdge] = []
    # Added with the resource trends (#48): the forecast behind an *_exhaustion finding
    forecast: Forecast | None = None

    def at_least(self, severity: str) -> bool:
        """True if this finding is *severity* or worse."""
        return SEVERITY_ORDER[self.severity] >= SEVERITY_ORDER[severity]


class FindingsReport(msgspec.Struct, kw_only=True):
    """``{"findings": [...]}``, the document of ``ddptop doctor --json``."""

    findings: list[Finding]
    job_id: str = ""
    time: float = 0.0
    ranks_seen: int = 0  # added with ddptop.api: how many ranks the diagnosis saw
