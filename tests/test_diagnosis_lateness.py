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
    assert any(re.search(r"enters collectives 1[45]\d ms after the first rank", e)
               for e in f.evidence), f.evidence
    assert "input_bound" not in kinds(diagnose(s, h, NOW))


def test_clock_jitter_alone_names_nobody() -> None:
    s, h = with_times(8, slow=None, jitter_s=0.01)
    assert "straggler" not in kinds(diagnose(s, h, NOW))


def test_lateness_needs_common_milestones() -> None:
    s, _ = with_times(2, slow=1)
    s.ranks[0].collectives[0].enqueue_times = s.ranks[0].collectives[0].enqueue_times[:2]
    assert entry_lateness(s, {0, 1}) == {}


def test_lateness_is_robust_to_one_slow_collective() -> None:
    s, _ = with_times(3, slow=None, jitter_s=0.0)
    times = s.ranks[1].collectives[0].enqueue_times
    seq, t = times[5]
    times[5] = (seq, t + 2.0)  # one checkpoint-sized hiccup is not a straggler
    late = entry_lateness(s, {0, 1, 2})
    assert late[1].late_s < 0.01 and late[1].collectives == 40


def test_healthy_has_no_lateness_finding() -> None:
    s, h = healthy()
    assert "straggler" not in kinds(diagnose(s, h, NOW))


# Each test below kills mutants of ddptop/diagnosis/lateness.py that survived
# bench/mutation.py (named in the docstring by mutmut's number for entry_lateness).


def test_lateness_compares_only_the_ranks_asked_for_wherever_they_sit() -> None:
    """Rank 0 (first in the snapshot) is not asked for: the others are still compared (#4:
    `continue` -> `break`)."""
    s, _ = with_times(4, slow=2)
    late = entry_lateness(s, {1, 2, 3})
    assert sorted(late) == [1, 2, 3]
    assert 0.14 < late[2].late_s < 0.16 and late[1].late_s < 0.01


def test_a_rank_without_milestones_or_without_the_group_is_left_out() -> None:
    """Ranks that reported no enqueue times, or not this group at all, leave the others
    comparable (#10: `and` -> `or` takes an empty or missing group as a rank's times)."""
    s, _ = with_times(4, slow=2)
    s.ranks[1].collectives[0].enqueue_times = []
    s.ranks[3].collectives = []
    late = entry_lateness(s, {0, 1, 2, 3})
    assert sorted(late) == [0, 2]
    assert 0.14 < late[2].late_s < 0.16


def test_two_ranks_are_enough_to_compare() -> None:
    """A two-rank job has a straggler to name (#14, #15: `< 2` -> `<= 2`, `< 3`)."""
    s, h = with_times(2, slow=1)
    late = entry_lateness(s, {0, 1})
    assert sorted(late) == [0, 1] and 0.14 < late[1].late_s < 0.16
    assert only(diagnose(s, h, NOW), "straggler").ranks == [1]


def test_exactly_the_minimum_of_common_milestones_is_enough() -> None:
    """MIN_COMMON_SEQS common milestones are compared, one fewer are not (#18: `<` -> `<=`)."""
    from ddptop.diagnosis.lateness import MIN_COMMON_SEQS

    s, _ = with_times(2, slow=1)
    g = s.ranks[0].collectives[0]
    full = list(g.enqueue_times)
    g.enqueue_times = full[:MIN_COMMON_SEQS]
    assert entry_lateness(s, {0, 1})[1].collectives == MIN_COMMON_SEQS
    g.enqueue_times = full[:MIN_COMMON_SEQS - 1]
    assert entry_lateness(s, {0, 1}) == {}


def test_lateness_names_the_seq_range_it_is_over() -> None:
    """The first and last common milestone, in the result and in the straggler's evidence
    (#28, #29, #35, #36, #37: `seqs[0]`/`seqs[-1]` -> None, `seqs[1]`, `seqs[+1]`, `seqs[-2]`).
    Rank 0 reported milestones 16-320 only, so the common range is 16-320."""
    s, h = with_times(4, slow=2)
    g = s.ranks[0].collectives[0]
    g.enqueue_times = g.enqueue_times[1:]
    late = entry_lateness(s, {0, 1, 2, 3})
    assert {(x.first_seq, x.last_seq, x.collectives) for x in late.values()} == {
        (2 * ENQUEUE_STRIDE, 40 * ENQUEUE_STRIDE, 39)}
    f = only(diagnose(s, h, NOW), "straggler")
    assert any(f"(a quarter or more of 39 collectives, seq {2 * ENQUEUE_STRIDE}-{40 * ENQUEUE_STRIDE})" in e
               for e in f.evidence), f.evidence


def test_a_rank_late_in_every_other_collective_is_the_straggler() -> None:
    """The probe's step: DDP's all-reduce (the slow rank enters it 150 ms late) and then a stop
    flag all-reduced by every rank at once. A median over the two kinds flips with their mix;
    the upper quartile names the rank late in half of them, by the amount it is late."""
    s, h = with_times(3, slow=None, jitter_s=0.002)
    g = s.ranks[1].collectives[0]
    g.enqueue_times = [(seq, t + (0.15 if i % 2 else 0.0)) for i, (seq, t) in enumerate(g.enqueue_times)]
    late = entry_lateness(s, {0, 1, 2})
    assert 0.14 < late[1].late_s < 0.16 and late[0].late_s < 0.01 and late[2].late_s < 0.01
    assert only(diagnose(s, h, NOW), "straggler").ranks == [1]


def test_hiccups_scattered_over_two_healthy_ranks_name_nobody() -> None:
    """A loaded machine: each of two healthy ranks is late by 100 ms now and then (a fifth of the
    collectives between them), never most of the time: no straggler."""
    s, h = with_times(2, slow=None, jitter_s=0.002)
    rng = random.Random(7)
    for r in (0, 1):
        g = s.ranks[r].collectives[0]
        g.enqueue_times = [(seq, t + (0.1 if rng.random() < 0.1 else 0.0)) for seq, t in g.enqueue_times]
    assert all(v.late_s < 0.05 for v in entry_lateness(s, {0, 1}).values())
    assert "straggler" not in kinds(diagnose(s, h, NOW))
