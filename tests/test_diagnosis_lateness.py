"""The compute straggler: equal step times everywhere, but one rank enters collectives late."""

from __future__ import annotations

import random
import re

from ddptop.diagnosis import diagnose
from ddptop.diagnosis.lateness import entry_lateness
from ddptop.protocol import ENQUEUE_STRIDE, CollectiveGroup
from tests.test_diagnosis_rules import NOW, healthy, kinds, only, rank, samples, snap


def enqueue_times(late_s: float, jitter_s: float, seed: int, count: int = 40) -> list[tuple[int, float]]:
    """Milestone seqs 8, 16, ... entered every 0.2 s, *late_s* behind, with jitter."""
    rng = random.Random(seed)
    start = NOW - count * 0.2
    return [(ENQUEUE_STRIDE * (i + 1), start + i * 0.2 + late_s + rng.uniform(0, jitter_s))
            for i in range(count)]


def with_times(world: int, slow: int | None, late_s: float = 0.15, jitter_s: float = 0.004):
    states = []
    for r in range(world):
        group = CollectiveGroup(pg="0", seq=3000, size=world, backend="gloo", seq_changed_at=NOW - 0.1,
                                enqueue_times=enqueue_times(late_s if r == slow else 0.0, jitter_s, r))
        states.append(rank(r, world, collectives=[group]))
    # Synchronous DDP: every rank's step time and data wait look the same.
    return snap(states), {r: samples(step_time=0.2, wait=0.01) for r in range(world)}


def test_late_entrant_is_named_the_straggler() -> None:
    s, h = with_times(4, slow=2)
    f = only(diagnose(s, h, NOW), "straggler")
    assert f.ranks == [2]
    assert any(re.search(r"enters each collective 1[45]\d ms after the first rank", e)
               for e in f.evidence), f.evidence
    assert "input_bound" not in kinds(diagnose(s, h, NOW))


def test_clock_jitter_alone_names_nobody() -> None:
    s, h = with_times(8, slow=None, jitter_s=0.01)
    assert "straggler" not in kinds(diagnose(s, h, NOW))


def test_lateness_needs_common_milestones() -> None:
    s, _ = with_times(2, slow=1)
    s.ranks[0].collectives[0].enqueue_times = s.ranks[0].collectives[0].enqueue_times[:2]
    assert entry_lateness(s, {0, 1}) == {}


def test_lateness_median_is_robust_to_one_slow_collective() -> None:
    s, _ = with_times(3, slow=None, jitter_s=0.0)
    times = s.ranks[1].collectives[0].enqueue_times
    seq, t = times[5]
    times[5] = (seq, t + 2.0)  # one checkpoint-sized hiccup is not a straggler
    late = entry_lateness(s, {0, 1, 2})
    assert late[1].median_s < 0.01 and late[1].collectives == 40


def test_healthy_has_no_lateness_finding() -> None:
    s, h = healthy()
    assert "straggler" not in kinds(diagnose(s, h, NOW))
