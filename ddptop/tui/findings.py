"""Findings for the dashboard: the diagnosis package, guarded so a broken rule never
takes the screen down (the error is logged and shown as a finding instead).
"""

from __future__ import annotations

import logging

from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.finding import SEVERITY_ORDER, Finding
from ddptop.model.job import JobModel

log = logging.getLogger(__name__)


def findings(model: JobModel, now: float) -> list[Finding]:
    """Current findings, worst first."""
    try:
        found = findings_for_model(model, now)
    except Exception as exc:  # a broken rule must not blank the dashboard
        log.warning("diagnosis failed: %s", exc)
        return [Finding(kind="diagnosis_error", severity="info", ranks=[],
                        title=f"diagnosis failed: {type(exc).__name__}: {exc}")]
    return sorted(found, key=lambda f: (-SEVERITY_ORDER[f.severity], f.ranks[:1]))


def worst(found: list[Finding]) -> Finding | None:
    """The most severe finding (first after :func:`findings` sorted them)."""
    return max(found, key=lambda f: SEVERITY_ORDER[f.severity], default=None)

