"""Diagnosis scale benchmark: where ``findings_for_model`` spends its time, 4096 to 32,768 ranks.

Run: ``.venv/bin/python bench/diagnosis_scale.py [--ranks 4096,8192] [--scenarios healthy,hang]
[--ticks 35] [--repeat 3]``; the default sizes are issue 23's (4096, 8192, 16384, 32768).

For each size and scenario a :class:`~ddptop.model.job.JobModel` is fed the synthetic
generator's states (``FakeRanks.state``), ``--ticks`` per rank, tick by tick as a viewer
receives them (``RecordEntry(time, rank, StateMsg(state))`` folded with ``model.apply``);
in the ``silent`` scenario the odd rank's states stop at the event and its node agent's
stuck report arrives as a ``StacksMsg``. Building the model is not timed (and at 32,768
ranks takes about a minute: ``FakeRanks.state`` is pure Python).

Then, each the median of ``--repeat`` runs of this process's CPU time (``time.process_time``:
the dashboard's diagnosis thread shares the GIL, so CPU, not wall time, is what it takes
from the UI):

* ``snapshot``: ``model.snapshot(now)``;
* ``histories``: ``recent_histories(model, now, window_s + margin)``;
* one row per rule of ``RULES``, given that snapshot and those histories, called on its own:
  what it derives alike with other rules (the active ranks, the rate windows: see
  ``ddptop.diagnosis.memo``) it computes itself here, so the rows add up to more than
  the total, where that is done once (straggler and input_bound each show the windows);
* ``total``: ``findings_for_model(model, now)`` end to end, the figure the dashboard pays
  (its background thread waits 5x this between runs).

Timings on a shared 2-core machine are noisy; run it alone for numbers you quote.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddptop.diagnosis import HISTORY_MARGIN_S, RULES, findings_for_model, recent_histories
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.model.job import JobModel
from ddptop.protocol import RecordEntry, StacksMsg, StateMsg
from ddptop.testing.synthetic_ranks import FakeRanks

T0 = 1_000_000.0
DEFAULT_RANKS = "4096,8192,16384,32768"


def build_model(n_ranks: int, scenario: str, ticks: int) -> tuple[JobModel, float]:
    """A model of *n_ranks* synthetic ranks after *ticks* samples each, and the time to read it at."""
    fake = FakeRanks(n_ranks, "j", scenario, 1.0, T0)
    model = JobModel()
    for tick in range(ticks):
        for rank in range(n_ranks):
            if fake.heard_tick(rank, tick) != tick:
                continue  # the silent rank: no state after the event
            state = fake.state(rank, tick)
            model.apply(RecordEntry(time=state.time, rank=rank, message=StateMsg(state=state)))
    now = fake.due(n_ranks - 1, ticks - 1) + 0.5
    if scenario == "silent":
        stuck = fake.stuck_report(fake.odd_rank, now)
        if stuck is not None:
            model.apply(RecordEntry(time=stuck.time, rank=stuck.rank, message=StacksMsg.of_stuck(stuck)))
    return model, now


def cpu_median(call: Callable[[], object], repeat: int) -> float:
    """Median process CPU seconds of *repeat* calls."""
    times: list[float] = []
    for _ in range(repeat):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return statistics.median(times)


def measure(model: JobModel, now: float, repeat: int) -> dict[str, float]:
    """Seconds per part of the diagnosis (see the module docstring), by row name."""
    config = DiagnosisConfig()
    span = config.window_s + HISTORY_MARGIN_S
    rows = {"snapshot": cpu_median(lambda: model.snapshot(now), repeat),
            "histories": cpu_median(lambda: recent_histories(model, now, span), repeat)}
    snapshot, histories = model.snapshot(now), recent_histories(model, now, span)
    for rule in RULES:
        rows[rule.__name__] = cpu_median(lambda rule=rule: rule(snapshot, histories, now, config), repeat)
    rows["total"] = cpu_median(lambda: findings_for_model(model, now), repeat)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default=DEFAULT_RANKS, help="comma-separated job sizes")
    parser.add_argument("--scenarios", default="healthy,hang", help="synthetic scenarios (FakeRanks)")
    parser.add_argument("--ticks", type=int, default=35, help="samples per rank before measuring")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    args = parser.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    columns: list[tuple[str, dict[str, float]]] = []
    for scenario in args.scenarios.split(","):
        for n in sizes:
            model, now = build_model(n, scenario, args.ticks)
            found = findings_for_model(model, now)
            print(f"# {scenario} {n} ranks: {len(found)} findings "
                  f"({', '.join(sorted({f.kind for f in found})) or 'none'})", file=sys.stderr)
            columns.append((f"{scenario[:7]}/{n}", measure(model, now, args.repeat)))
            del model
    names = list(columns[0][1])
    width = max(len(n) for n in names)
    print(f"CPU ms per call (median of {args.repeat})")
    print(f"{'':{width}}  " + "  ".join(f"{label:>13}" for label, _ in columns))
    for name in names:
        print(f"{name:{width}}  " + "  ".join(f"{rows[name] * 1000:13.1f}" for _, rows in columns))


if __name__ == "__main__":
    main()
