"""Diagnosis: pure rules over a job's state that name what is wrong, why, and what to do.

``diagnose(snapshot, histories, now)`` runs every rule; ``findings_for_model(model, now)``
is the same for a :class:`~ddptop.model.job.JobModel` (the TUI's findings panel, replay
and ``ddptop doctor`` call it). Rules and thresholds: ``docs/diagnosis.md``.
"""

from __future__ import annotations

from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.engine import RULES, diagnose
from ddptop.diagnosis.finding import KINDS, SEVERITY_ORDER, Finding, FindingsReport
from ddptop.model.job import JobModel

__all__ = [
    "KINDS", "RULES", "SEVERITY_ORDER", "DiagnosisConfig", "Finding", "FindingsReport", "diagnose",
    "findings_for_model",
]


def findings_for_model(model: JobModel, now: float, config: DiagnosisConfig | None = None) -> list[Finding]:
    """Findings for the job as *model* knows it at *now* (most severe first)."""
    return diagnose(model.snapshot(now), model.histories(), now, config)
