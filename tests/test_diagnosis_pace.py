"""A diagnosis that gives way (ddptop.model.pace): the dashboard's background diagnosis pauses
its long passes while the UI is busy.

The hook is called where the module says (every EVERY ranks of the snapshot, of the histories
and of the rate windows, before each rule run, before each result the rules share, and between
the passes of the rules that make several), changes nothing a diagnosis finds, and
outside ``giving_way`` is never called. The dashboard's wiring: tests/test_tui_app.py.
"""

from __future__ import annotations

import sys
from collections import Counter

from ddptop.diagnosis import findings_for_model, recent_histories
from ddptop.diagnosis.cadence import Cadence
from ddptop.diagnosis.engine import RATE_RULES, RULES
from ddptop.model.job import JobModel
from ddptop.model.pace import EVERY, give_way, giving_way
from ddptop.protocol import RecordEntry, StateMsg
from tests.probes_tui.fakes import NOW, state
from tests.test_diagnosis_scale import _straggling, build_model


class Callers:
    """A hook that counts who gave way (the function that called ``give_way``)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def __call__(self) -> None:
        self.seen[sys._getframe(2).f_code.co_name] += 1  # 1: give_way, 2: its caller


def _one_state_each(n: int) -> JobModel:
    model = JobModel()
    for r in range(n):
        model.apply(RecordEntry(time=NOW, rank=r, message=StateMsg(state=state(r, world=n))))
    return model


def test_the_long_passes_give_way_every_EVERY_ranks() -> None:
    n = 2 * EVERY + 1  # three chunks
    model = _one_state_each(n)
    hook = Callers()
    with giving_way(hook):
        model.snapshot(NOW)
        recent_histories(model, NOW, 30.0)
    # The snapshot: before each chunk, and once more before it is assembled.
    assert hook.seen == {"snapshot": 3 + 1, "recent_histories": 3}


def test_a_diagnosis_gives_way_before_every_rule_and_finds_the_same() -> None:
    model, now = build_model("straggler", _straggling, n_ranks=512)
    whole = findings_for_model(model, now)
    assert {"straggler", "input_bound"} <= {f.kind for f in whole}  # the rate windows were judged
    hook = Callers()
    with giving_way(hook):
        assert findings_for_model(model, now) == whole
    chunks = -(-512 // EVERY)
    assert 1 <= hook.seen.pop("_settled") <= chunks  # the ranks the rate rules judge: most
    assert hook.seen.pop("shared") >= 5  # before each result the rules share (active ranks, windows...)
    # Within the rules that pass over every rank more than once: between their passes (one
    # process group here), and every EVERY ranks of a loop.
    # The wait-for graph (wait_graph.build): its two passes over the ranks, every EVERY ranks.
    inside = {"_unequal_train": 2, "_unequal_eval": chunks, "build": 2 * chunks, "collective_mismatch": 1}
    assert {k: hook.seen.pop(k) for k in inside} == inside
    assert hook.seen == {"snapshot": chunks + 1, "recent_histories": chunks, "diagnose_by_rule": len(RULES)}
    # A carried diagnosis (the rate rules not run) gives way before the rules it runs only.
    plain, paced, hook = Cadence(every_s=10.0, from_ranks=1), Cadence(every_s=10.0, from_ranks=1), Callers()
    assert plain.findings(model, now) == paced.findings(model, now)
    with giving_way(hook):
        carried = paced.findings(model, now + 1.0)
    assert carried == plain.findings(model, now + 1.0)
    assert hook.seen["diagnose_by_rule"] == len(RULES) - len(RATE_RULES) and "_settled" not in hook.seen


def test_outside_giving_way_nothing_is_called() -> None:
    hook = Callers()
    with giving_way(hook):
        give_way()
    give_way()  # no hook: nothing happens
    model, now = build_model("healthy", n_ranks=64)
    findings_for_model(model, now)
    assert hook.seen.total() == 1
