"""Findings of a big job at the dashboard's pace: the rate rules every few seconds, the rest each time.

The dashboard diagnoses about once a second. At 32,768 ranks half of a diagnosis is the two
rules judged over each rank's window of samples (``engine.RATE_RULES``: straggler and
input_bound, ``window_s`` = 30 s of persistent behaviour), plus copying those windows. Their
verdict cannot change much within seconds, while a stall, a mismatch, a silent or a dead rank
must be named at once. From :data:`RATE_EVERY_FROM_RANKS` ranks, :class:`Cadence` runs the
rate rules at most every :data:`RATE_EVERY_S` seconds and carries their last findings between
runs (in the engine's order, as if they had run); every other rule runs every time, on the
histories only ended and silent ranks need. Below that size every diagnosis is whole.
tests/test_diagnosis_cadence.py holds a carried diagnosis equal to a whole one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.diagnosis import GONE, HISTORY_MARGIN_S, recent_histories
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.engine import RATE_RULES, Rule, diagnose_by_rule
from ddptop.diagnosis.finding import Finding
from ddptop.model.job import JobModel
from ddptop.protocol import Sample

RATE_EVERY_FROM_RANKS = 4096
RATE_EVERY_S = 10.0


@dataclass
class Cadence:
    """One viewer's diagnoses over time (not thread-safe: one diagnosis at a time)."""

    every_s: float = RATE_EVERY_S
    from_ranks: int = RATE_EVERY_FROM_RANKS
    config: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    rates_at: float | None = None  # when the rate rules last ran (the diagnosis's *now*)
    _rates: dict[Rule, list[Finding]] = field(default_factory=dict)

    def findings(self, model: JobModel, now: float) -> list[Finding]:
        """``findings_for_model(model, now)``, the rate rules' part maybe a few seconds old."""
        at = self.rates_at
        carry = len(model.ranks) >= self.from_ranks and at is not None and 0.0 <= now - at < self.every_s
        snapshot = model.snapshot(now)
        if carry:
            found, _ = diagnose_by_rule(snapshot, _gone_histories(model, now), now, self.config, self._rates)
            return found
        span = self.config.window_s + HISTORY_MARGIN_S
        found, by_rule = diagnose_by_rule(snapshot, recent_histories(model, now, span), now, self.config)
        self._rates = {rule: by_rule.get(rule, []) for rule in RATE_RULES}
        self.rates_at = now
        return found


def _gone_histories(model: JobModel, now: float) -> dict[int, list[Sample]]:
    """The histories the rules other than the rate rules read: those of ranks that are gone
    or silent ("last seen at step N"), whole, as recent_histories gives them."""
    statuses = model.statuses(now)
    return {rank: list(view.history) for rank, view in model.ranks.items()
            if (s if (s := statuses.get(rank)) is not None else view.status(now)) in GONE}
