"""Findings for the dashboard: the diagnosis package, guarded so a broken rule never
takes the screen down (the error is logged and shown as a finding instead).
"""

from __future__ import annotations

import logging

from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.cadence import Cadence
from ddptop.diagnosis.finding import SEVERITY_ORDER, Finding
from ddptop.model.job import JobModel

log = logging.getLogger(__name__)


__all__ = ["Cadence", "findings", "worst"]


def findings(model: JobModel, now: float, cadence: Cadence | None = None) -> list[Finding]:
    """Current findings in the engine's order: worst first, and within a severity the root
    cause before its consequences (a diverging rank before the victim that aborted). With a
    *cadence* (the background diagnosis of a big job) the rate rules keep its pace."""
    try:
        found = findings_for_model(model, now) if cadence is None else cadence.findings(model, now)
    except Exception as exc:  # a broken rule must not blank the dashboard
        log.warning("diagnosis failed: %s", exc)
        return [Finding(kind="diagnosis_error", severity="info", ranks=[],
                        title=f"diagnosis failed: {type(exc).__name__}: {exc}")]
    return found


def worst(found: list[Finding]) -> Finding | None:
    """The most severe finding; of equals, the engine's first (the root cause)."""
    return max(found, key=lambda f: SEVERITY_ORDER[f.severity], default=None)

