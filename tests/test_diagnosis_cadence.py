"""A big job's diagnosis with the rate rules carried between their runs (ddptop.diagnosis.cadence).

Carried or not, the findings are those of a whole diagnosis at the same moment, in every
scenario of the generator plus a straggler and ended ranks (the models of
tests/test_diagnosis_scale.py); the rate rules run again only once ``every_s`` passed, and a
job below ``from_ranks`` is always diagnosed whole.
"""

from __future__ import annotations

import pytest

from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.cadence import Cadence
from ddptop.testing.synthetic_ranks import SCENARIOS
from tests.test_diagnosis_scale import _straggling, build_model


@pytest.mark.parametrize("scenario", [*SCENARIOS, "straggler", "ended"])
def test_carried_rate_findings_equal_a_whole_diagnosis(scenario: str) -> None:
    model, now = build_model(scenario, _straggling if scenario == "straggler" else None, n_ranks=512)
    whole = findings_for_model(model, now)
    cadence = Cadence(every_s=10.0, from_ranks=1)
    assert cadence.findings(model, now) == whole  # the first run is whole
    assert cadence.rates_at == now
    assert cadence.findings(model, now) == whole  # carried: the same findings, in the same order
    assert cadence.rates_at == now


def test_rate_rules_run_again_only_after_every_s() -> None:
    model, now = build_model("straggler", _straggling, n_ranks=512)
    cadence = Cadence(every_s=10.0, from_ranks=1)
    first = {f.kind: f for f in cadence.findings(model, now)}
    assert {"straggler", "input_bound"} <= first.keys()
    carried = {f.kind: f for f in cadence.findings(model, now + 5.0)}
    assert carried["straggler"] is first["straggler"] and carried["input_bound"] is first["input_bound"]
    assert cadence.rates_at == now
    again = {f.kind: f for f in cadence.findings(model, now + 10.0)}
    assert cadence.rates_at == now + 10.0 and again.get("straggler") is not first["straggler"]


def test_a_smaller_job_is_always_diagnosed_whole() -> None:
    model, now = build_model("straggler", _straggling, n_ranks=512)
    cadence = Cadence(every_s=10.0, from_ranks=513)
    first = {f.kind: f for f in cadence.findings(model, now)}
    second = {f.kind: f for f in cadence.findings(model, now + 1.0)}
    assert second["straggler"] is not first["straggler"] and cadence.rates_at == now + 1.0
