"""Findings for the dashboard: the diagnosis package, guarded so a broken rule never
takes the screen down (the error is logged and shown as a finding instead), and when the
dashboard diagnoses again (:class:`FindingsPace`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.cadence import Cadence
from ddptop.diagnosis.finding import SEVERITY_ORDER, Finding
from ddptop.model.job import JobModel

log = logging.getLogger(__name__)


__all__ = ["Cadence", "FindingsPace", "findings", "worst"]

FINDINGS_EVERY_S = 1.0  # at most this often: not per redraw
# A background diagnosis begins again this many of its own durations after the last began:
# it shares the interpreter with the UI, so it takes about a fifth of the time however big
# the job (4,096 ranks: ~0.05 s a diagnosis; 32,768: ~1.2-1.7 s, so one every 6-8 s;
# bench/dashboard_cpu.py).
SHARE = 5.0
# ...but a rank's status word that changed (stale, lost, crashed, exited) deserves a finding
# sooner: as early as this many durations after the last began (a third of the time at most
# while words keep changing, as in a teardown of thousands of ranks).
EARLY_SHARE = 2.0
QUIET_WORDS = frozenset(("running", "starting"))


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


@dataclass
class FindingsPace:
    """When the dashboard diagnoses again; pure, the app's monotonic clock passed in.

    Due once a second, a big job's background diagnosis no sooner than :data:`SHARE` times
    its last duration after the last began; at once when the number of ranks changed (first
    data, a rank appearing), and after :data:`EARLY_SHARE` durations when the ranks' status
    words changed (how many are stale, lost, crashed...) since the last one began.
    """

    every_s: float = FINDINGS_EVERY_S
    last: float = -math.inf  # when the last diagnosis began
    ranks: int = -1  # how many ranks it saw
    words: dict[str, int] = field(default_factory=dict)  # their words but running and starting
    took_s: float = 0.0  # how long the last background diagnosis took (wall, its waits too)

    def due(self, wall: float, ranks: int, words: Mapping[str, int] | None = None) -> bool:
        """Whether to diagnose at *wall* (*words*: counts of status words, when known)."""
        since = wall - self.last
        if ranks != self.ranks or since >= max(self.every_s, SHARE * self.took_s):
            return True
        return (words is not None and since >= max(self.every_s, EARLY_SHARE * self.took_s)
                and quiet_free(words) != self.words)

    def began(self, wall: float, ranks: int, words: Mapping[str, int] | None = None) -> None:
        """A diagnosis began at *wall* over *ranks* ranks whose words were *words*."""
        self.last, self.ranks = wall, ranks
        if words is not None:
            self.words = quiet_free(words)

    def took(self, seconds: float) -> None:
        """The background diagnosis that began last took *seconds*."""
        self.took_s = seconds


def quiet_free(words: Mapping[str, int]) -> dict[str, int]:
    """The counts of words that are news (not running, not starting)."""
    return {w: n for w, n in words.items() if n and w not in QUIET_WORDS}


def worst(found: list[Finding]) -> Finding | None:
    """The most severe finding; of equals, the engine's first (the root cause)."""
    return max(found, key=lambda f: SEVERITY_ORDER[f.severity], default=None)

