"""The diagnosis's shortcuts for large jobs find exactly what the full path finds.

``findings_for_model`` shares derived results between rules (:mod:`ddptop.diagnosis.memo`),
computes the rate windows' medians without copying (:mod:`ddptop.diagnosis.windows`), and
lets straggler judge only the ranks that can qualify.
The reference here is the path as it was before those shortcuts: every rule on its own,
each rank's history window chosen by its view's own status, windows copied and their
medians taken by ``common.median``, every settled rank judged. Both run on synthetic jobs of a
thousand ranks in every scenario of the generator, plus a straggler, an input-bound rank,
a restarted rank and ended ranks, and must give equal findings. No timing here: speed
lives in ``bench/diagnosis_scale.py``.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import random
from collections.abc import Callable, Iterator
from operator import attrgetter

import msgspec
import pytest

from ddptop import diagnosis
from ddptop.diagnosis import GONE, findings_for_model, recent_samples, rules_progress
from ddptop.diagnosis import engine as diagnosis_engine
from ddptop.diagnosis import windows as diagnosis_windows
from ddptop.diagnosis.common import active, fresh_ranks, median
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.windows import Window, window_median
from ddptop.model.job import JobModel
from ddptop.model.snapshot import JobInfo, JobSnapshot
from ddptop.protocol import ConnectionEvent, RankExit, RankState, RecordEntry, Sample, StacksMsg, StateMsg
from ddptop.testing.synthetic_ranks import SCENARIOS, FakeRanks

N_RANKS = 1024  # a size the suite builds eight models of in seconds (2,048 took 43 s in CI)
TICKS = 36  # past warm-up, and a full window_s of samples
T0 = 1_000_000.0
SLOW_RANK, HUNGRY_RANK, RESTARTED_RANK, CRASHED_RANK = 5, 300, 400, 450  # all below 512 (cadence tests)

Tweak = Callable[[RankState, int], RankState]


def _straggling(state: RankState, tick: int) -> RankState:
    """A rank 1.6x slower per step, one waiting for data with an empty queue, one restarted."""
    if state.rank == SLOW_RANK and state.step_time_s:
        return msgspec.structs.replace(state, step_time_s=state.step_time_s * 1.6)
    if state.rank == HUNGRY_RANK:
        return msgspec.structs.replace(state, data_wait_fraction=0.7 + 0.01 * (tick % 5),
                                       loader_ready_batches=0)
    if state.rank == RESTARTED_RANK:
        return msgspec.structs.replace(state, restart_count=1, start_time=state.time - 20.0)
    return state


def build_model(scenario: str, tweak: Tweak | None = None, n_ranks: int = N_RANKS) -> tuple[JobModel, float]:
    """A synthetic job after TICKS samples per rank, as a viewer folds them, and the time to read it."""
    base = "healthy" if scenario in ("straggler", "ended") else scenario
    fake = FakeRanks(n_ranks, "j", base, 1.0, T0)
    model = JobModel()
    for tick in range(TICKS):
        for rank in range(n_ranks):
            if fake.heard_tick(rank, tick) != tick:
                continue
            state = fake.state(rank, tick)
            if tweak is not None:
                state = tweak(state, tick)
            model.apply(RecordEntry(time=state.time, rank=rank, message=StateMsg(state=state)))
    now = fake.due(n_ranks - 1, TICKS - 1) + 0.5
    stuck = fake.stuck_report(fake.odd_rank, now)
    if stuck is not None:
        model.apply(RecordEntry(time=stuck.time, rank=stuck.rank, message=StacksMsg.of_stuck(stuck)))
    if scenario == "lost":
        model.apply(ConnectionEvent(time=now - 2.0, rank=fake.odd_rank, status="lost", reason="reset"))
    if scenario == "ended":
        model.apply(RankExit(time=now - 3.0, rank=CRASHED_RANK, pid=fake.pid, host=fake.host(CRASHED_RANK),
                             signal="SIGSEGV"))
    return model, now


def _reference_settled(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                       config: DiagnosisConfig) -> dict[int, Window]:
    """The rate windows as before: each copied, its medians by ``common.median`` over the copy."""
    fresh = fresh_ranks(snapshot, now, config)
    out: dict[int, Window] = {}
    for s in active(snapshot):
        if s.rank in fresh or s.status != "running":
            continue
        history = histories.get(s.rank, [])
        since = max(now - config.window_s, s.start_time)
        samples = list(history[bisect.bisect_left(history, since, key=lambda x: x.time):])
        if len(samples) >= config.min_samples:
            out[s.rank] = _ReferenceWindow(samples, 0, median(x.step_time_s for x in samples),
                                           median(x.data_wait_fraction for x in samples))
    return out


def _reference_histories(model: JobModel, now: float, span_s: float) -> dict[int, list[Sample]]:
    """recent_histories as before: each view asked its own status."""
    since = now - span_s
    return {rank: list(view.history) if view.status(now) in GONE else recent_samples(view.history, since)
            for rank, view in model.ranks.items()}


class _ReferenceWindow(Window):
    def ready_batches(self) -> float | None:
        return median(x.loader_ready_batches for x in self.samples[self.start:])


@contextlib.contextmanager
def full_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The diagnosis without its shortcuts: no memo, copied windows, every settled rank judged."""
    with monkeypatch.context() as patch:
        patch.setattr(diagnosis_engine, "one_diagnosis", contextlib.nullcontext)
        patch.setattr(diagnosis, "recent_histories", _reference_histories)
        patch.setattr(rules_progress, "settled", _reference_settled)
        patch.setattr(rules_progress, "_suspects", lambda windows, *_: set(windows))
        yield


def _both(model: JobModel, now: float,
          monkeypatch: pytest.MonkeyPatch) -> tuple[list[Finding], list[Finding]]:
    """Findings of the fast and the full path; the rate windows the rules read must be equal too
    (findings round medians to a few digits: a window one sample off could pass unseen)."""
    fast_windows: list[WindowValues] = []
    with monkeypatch.context() as patch:
        patch.setattr(rules_progress, "settled", _recording(diagnosis_windows.settled, fast_windows))
        fast = findings_for_model(model, now)
    full_windows: list[WindowValues] = []
    with full_path(monkeypatch), monkeypatch.context() as patch:
        patch.setattr(rules_progress, "settled", _recording(_reference_settled, full_windows))
        full = findings_for_model(model, now)
    assert fast_windows == full_windows
    return fast, full


WindowValues = dict[int, tuple[float | None, float | None, float | None, list[Sample]]]
Settled = Callable[[JobSnapshot, dict[int, list[Sample]], float, DiagnosisConfig], dict[int, Window]]


def _recording(settled: Settled, seen: list[WindowValues]) -> Settled:
    """*settled* that also notes every window it gives: its medians and its samples."""
    def recorded(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                 config: DiagnosisConfig) -> dict[int, Window]:
        windows = settled(snapshot, histories, now, config)
        seen.append({rank: (w.step_time_s, w.data_wait, w.ready_batches(), list(w.samples[w.start:]))
                     for rank, w in windows.items()})
        return windows
    return recorded


# One worker builds the models once for the module (make test: --dist loadgroup).
pytestmark = [pytest.mark.long, pytest.mark.xdist_group("diagnosis-scale")]


@pytest.fixture(scope="module")
def models() -> dict[str, tuple[JobModel, float]]:
    out = {scenario: build_model(scenario) for scenario in SCENARIOS}
    out["straggler"] = build_model("straggler", _straggling)
    out["ended"] = build_model("ended", _straggling)
    return out


@pytest.mark.parametrize("scenario", [*SCENARIOS, "straggler", "ended"])
def test_findings_equal_the_full_path(scenario: str, models: dict[str, tuple[JobModel, float]],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model, now = models[scenario]
    fast, full = _both(model, now, monkeypatch)
    assert fast == full
    if scenario in ("hang", "desync", "silent"):
        assert fast, "the event scenarios must find something, or equality proves little"


def test_straggler_scenario_exercises_the_rate_rules(models: dict[str, tuple[JobModel, float]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcuts are tested on findings they could lose: the slow and the hungry rank."""
    model, now = models["straggler"]
    fast, _ = _both(model, now, monkeypatch)
    found = {(f.kind, tuple(f.ranks)) for f in fast}
    assert ("straggler", (SLOW_RANK,)) in found
    assert ("input_bound", (HUNGRY_RANK,)) in found


def test_later_moments_equal_the_full_path(models: dict[str, tuple[JobModel, float]],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Read at other times (warm-up over or not, stale ranks), the same model gives the same findings."""
    model, now = models["straggler"]
    for at in (T0 + 10.0, T0 + 20.0, now + 4.0, now + 40.0):
        fast, full = _both(model, at, monkeypatch)
        assert fast == full, at


def test_window_median_equals_common_median() -> None:
    rng = random.Random(23)
    for _ in range(500):
        n = rng.randrange(0, 12)
        samples = [Sample(time=float(i), step=i, epoch=0, batch=i, seq=i,
                          step_time_s=None if rng.random() < 0.2 else rng.choice([0.5, 0.25, rng.random()]),
                          data_wait_fraction=None, cpu_percent=None, rss_bytes=None, gpu_util_percent=None,
                          loader_ready_batches=None if rng.random() < 0.1 else rng.randrange(0, 4))
                   for i in range(n)]
        start = rng.randrange(0, n + 1)
        for field in ("step_time_s", "loader_ready_batches"):
            expected = median(getattr(s, field) for s in samples[start:])
            assert window_median(samples, start, attrgetter(field)) == expected


def test_straggler_suspects_never_drop_a_qualifying_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random step times and waits, crafted to sit near the thresholds: gated == every rank judged."""
    rng = random.Random(5)
    config = DiagnosisConfig()
    found = 0
    for trial in range(80):
        windows = {}
        for rank in range(rng.randrange(2, 30)):
            # Mostly alike (a straggler is named only when few are), some at or near a threshold.
            step: float | None = 0.5
            wait: float | None = 0.25  # 0.25 + gap - 0.25 is the gap exactly: the threshold itself
            if rng.random() < 0.3:
                step = rng.choice([None, 0.5 * config.straggler_ratio, 0.5 * config.straggler_ratio + 1e-9,
                                   0.5 + config.straggler_min_diff_s,
                                   rng.uniform(0.3, 1.2), *([math.nan, math.inf] if trial % 4 == 0 else [])])
                gap = 0.25 + config.straggler_wait_gap
                wait = rng.choice([None, gap, gap - 1e-9, rng.uniform(0.0, 0.8),
                                   *([math.nan] if trial % 4 == 1 else [])])
            windows[rank] = Window([], 0, step, wait)
        steps = sorted(w.step_time_s for w in windows.values() if w.step_time_s is not None)
        waits = sorted(w.data_wait for w in windows.values() if w.data_wait is not None)
        suspects = rules_progress._suspects(windows, steps, waits, config)
        states = [RankState(rank=r, local_rank=0, world_size=len(windows), host="h", pid=1, job_id="j",
                            status="running", time=100.0, start_time=1.0) for r in windows]
        snapshot = JobSnapshot(job=JobInfo(id="j", world_size=len(windows), time=100.0), ranks=states)
        with monkeypatch.context() as patch:
            patch.setattr(rules_progress, "settled", lambda *_, given=windows: given)
            fast = rules_progress.straggler(snapshot, {}, 100.0, config)
            patch.setattr(rules_progress, "_suspects", lambda w, *_: set(w))
            full = rules_progress.straggler(snapshot, {}, 100.0, config)
        assert fast == full, trial
        flagged = {r for f in full for r in f.ranks}
        assert flagged <= suspects
        found += bool(flagged)
    assert found >= 10, "too few trials name a straggler to show anything"

