"""Diagnosis: pure rules over a job's state that name what is wrong, why, and what to do.

``diagnose(snapshot, histories, now)`` runs every rule; ``findings_for_model(model, now)``
is the same for a :class:`~ddptop.model.job.JobModel` (the TUI's findings panel, replay
and ``ddptop doctor`` call it). Rules and thresholds: ``docs/diagnosis.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Reversible

from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.engine import RULES, diagnose
from ddptop.diagnosis.finding import KINDS, SEVERITY_ORDER, Finding, FindingsReport
from ddptop.model.job import JobModel
from ddptop.protocol import Sample

GONE = frozenset(("lost", "crashed", "exited", "stale"))

__all__ = [
    "KINDS", "RULES", "SEVERITY_ORDER", "DiagnosisConfig", "Finding", "FindingsReport", "diagnose",
    "findings_for_model", "recent_histories", "recent_samples",
]


def findings_for_model(model: JobModel, now: float, config: DiagnosisConfig | None = None) -> list[Finding]:
    """Findings for the job as *model* knows it at *now* (most severe first)."""
    config = config or DiagnosisConfig()
    return diagnose(model.snapshot(now), recent_histories(model, now, 2 * config.window_s), now, config)


def recent_histories(model: JobModel, now: float, span_s: float) -> dict[int, list[Sample]]:
    """Each running rank's samples of the last *span_s* seconds; whole histories of gone ranks.

    The rate rules only look at a recent window, and copying an hour of history for
    thousands of ranks once a second would cost the dashboard more than the rules do.
    Ranks that are gone keep everything: "last alive at step N" needs their last samples.
    """
    out: dict[int, list[Sample]] = {}
    since = now - span_s
    for rank, view in model.ranks.items():
        if view.status(now) in GONE:
            out[rank] = list(view.history)
            continue
        out[rank] = recent_samples(view.history, since)
    return out


def recent_samples(history: Iterable[Sample], since: float) -> list[Sample]:
    """The samples taken at or after *since*, oldest first (walks back from the newest)."""
    recent: list[Sample] = []
    for sample in reversed(list(history) if not isinstance(history, Reversible) else history):
        if sample.time < since:
            break
        recent.append(sample)
    recent.reverse()
    return recent
