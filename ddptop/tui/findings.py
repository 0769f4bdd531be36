"""Findings for the dashboard: the diagnosis package when present, else basic checks here.

``ddptop.diagnosis.findings_for_model`` is written in parallel; it is imported lazily on
every call so the dashboard picks it up as soon as it exists, and a failing rule never
takes the screen down (the fallback answers instead, and the error is logged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ddptop.cli.format import rank_ranges
from ddptop.diagnosis.finding import SEVERITY_ORDER, Finding, Severity
from ddptop.model.job import JobModel
from ddptop.tui import desync
from ddptop.tui.desync import desync_marks, oldest_pending

log = logging.getLogger(__name__)


def _diagnosis() -> Callable[[JobModel, float], list[Finding]] | None:
    try:
        import ddptop.diagnosis as diagnosis
    except ImportError:
        return None
    fn: Any = getattr(diagnosis, "findings_for_model", None)
    return fn if callable(fn) else None


def findings(model: JobModel, now: float) -> list[Finding]:
    """Current findings, worst first (diagnosis package, or :func:`basic_findings`)."""
    fn = _diagnosis()
    found: list[Finding] | None = None
    if fn is not None:
        try:
            found = list(fn(model, now))
        except Exception as exc:  # a broken rule must not blank the dashboard
            log.warning("diagnosis failed, using basic checks: %s", exc)
    if found is None:
        found = basic_findings(model, now)
    return sorted(found, key=lambda f: (-SEVERITY_ORDER[f.severity], f.ranks[:1]))


def worst(found: list[Finding]) -> Finding | None:
    """The most severe finding (first after :func:`findings` sorted them)."""
    return max(found, key=lambda f: SEVERITY_ORDER[f.severity], default=None)


def _ranks_with(marks: dict[int, list[str]], word: str) -> list[int]:
    return [r for r, m in sorted(marks.items()) if word in m]


def basic_findings(model: JobModel, now: float) -> list[Finding]:
    """Lag, mismatch, unequal batches, stale/lost/crashed: the checks the table marks."""
    marks = desync_marks(model, now)
    out: list[Finding] = []
    mismatch = _ranks_with(marks, desync.MISMATCH)
    if mismatch:
        ops = []
        for r in sorted(model.ranks):
            st = model.ranks[r].state
            op = oldest_pending(st) if st is not None else None
            if op is not None:
                ops.append(f"rank {r}: {op.op} #{op.seq} for {op.age_s:.0f}s")
        out.append(Finding(kind="collective_mismatch", severity="critical", ranks=mismatch,
                           title=f"ranks {rank_ranges(mismatch)} are in a different collective than "
                                 "their peers at the same seq", evidence=ops,
                           remedy="ranks took different code paths (unequal batches? rank-only save?)"))
    bpe = _ranks_with(marks, desync.BATCHES)
    if bpe:
        ev = [f"rank {r}: {v.state.batches_per_epoch} batches/epoch" for r, v in sorted(model.ranks.items())
              if v.state is not None and v.state.batches_per_epoch is not None]
        out.append(Finding(kind="unequal_batches", severity="warning", ranks=bpe,
                           title="dataloader lengths differ across ranks: the job will desync at "
                                 "the end of the epoch", evidence=ev,
                           remedy="seed the split (train_test_split(seed=...)), np.random.seed, "
                                  "use DistributedSampler"))
    checks: list[tuple[str, Severity, str]] = [(desync.LOST, "critical", "stopped answering"),
                                               (desync.CRASHED, "critical", "crashed"),
                                               (desync.STALE, "warning", "sent no state for a while")]
    for word, sev, what in checks:
        ranks = _ranks_with(marks, word)
        if ranks:
            out.append(Finding(kind="rank_lost", severity=sev, ranks=ranks,
                               title=f"rank(s) {rank_ranges(ranks)} {what}",
                               evidence=[f"rank {r}: {model.ranks[r].connection_reason or word.lower()}"
                                         for r in ranks]))
    lag = sorted(set(_ranks_with(marks, desync.LAG_SEQ)) | set(_ranks_with(marks, desync.LAG_STEP)))
    if lag:
        out.append(Finding(kind="straggler", severity="warning", ranks=lag,
                           title=f"rank(s) {rank_ranges(lag)} lag behind the leading rank",
                           evidence=[f"rank {r}: {', '.join(marks[r])}" for r in lag]))
    return out
