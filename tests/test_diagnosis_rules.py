"""Unit tests of every diagnosis rule on hand-built states, with a frozen clock."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import deque
from typing import Any

import msgspec
import pytest

from ddptop.diagnosis import KINDS, DiagnosisConfig, diagnose, findings_for_model, recent_samples
from ddptop.diagnosis.engine import RULES
from ddptop.diagnosis.finding import Finding
from ddptop.model.job import JobModel
from ddptop.model.snapshot import JobSnapshot, build_snapshot
from ddptop.protocol import (
    CollectiveGroup,
    GpuInfo,
    HistoryMsg,
    ParamFingerprint,
    PendingOp,
    RankState,
    RecordEntry,
    RngFingerprint,
    Sample,
    StateMsg,
    Versions,
)

NOW = 1_000_000.0
START = NOW - 600.0  # ranks started 10 minutes ago: past every warm-up


def rank(r: int, world: int = 4, **kw: Any) -> RankState:
    """A healthy running rank at NOW, overridable field by field."""
    base: dict[str, Any] = dict(
        rank=r, local_rank=r, world_size=world, host="node-0", pid=1000 + r, job_id="j",
        status="running", time=NOW - 0.2, start_time=START, step=500, step_time_s=0.2,
        last_step_at=NOW - 0.1, epoch=1, batch=100, batches_per_epoch=1250, data_wait_fraction=0.05,
        loader_ready_batches=2, loader_workers=2, backend="gloo", cpu_count=16,
        shm_used_bytes=10 << 20, shm_total_bytes=8 << 30,
        collectives=[CollectiveGroup(pg="0", seq=3000, size=world, backend="gloo",
                                     seq_changed_at=NOW - 0.1)],
        versions=Versions(python="3.11.9", torch="2.13.0", ddptop="0.1"),
        param_fingerprint=ParamFingerprint(count=2, numel=20, shapes_hash="h",
                                           shapes=[("w", [4, 4]), ("b", [4])]),
        rng_fingerprint=RngFingerprint(epoch=1, torch="t", numpy="n", python="p"),
    )
    base.update(kw)
    return RankState(**base)


def samples(n: int = 20, step_time: float = 0.2, wait: float = 0.05, ready: int | None = 2,
            end: float = NOW, start_step: int = 400) -> list[Sample]:
    """n samples, one per second, ending at *end*."""
    return [Sample(time=end - (n - 1 - i), step=start_step + 5 * i, epoch=1, batch=50 + 5 * i, seq=i * 10,
                   step_time_s=step_time, data_wait_fraction=wait, loader_ready_batches=ready,
                   cpu_percent=100.0, rss_bytes=1 << 30, gpu_util_percent=None) for i in range(n)]


def snap(states: list[RankState], world: int | None = None,
         unreachable: dict[int, str] | None = None) -> JobSnapshot:
    return build_snapshot("j", world if world is not None else len(states), states, unreachable or {}, NOW)


def healthy(world: int = 4) -> tuple[JobSnapshot, dict[int, list[Sample]]]:
    states = [rank(r, world) for r in range(world)]
    return snap(states), {r: samples() for r in range(world)}


def kinds(findings: list[Finding], at_least: str = "info") -> list[str]:
    return [f.kind for f in findings if f.at_least(at_least)]


def only(findings: list[Finding], kind: str) -> Finding:
    hits = [f for f in findings if f.kind == kind]
    assert len(hits) == 1, f"expected one {kind}, got {findings}"
    return hits[0]


def pend(seq: int, op: str = "gloo:all_reduce", age: float = 12.0, sizes: Any = None) -> PendingOp:
    return PendingOp(seq=seq, op=op, age_s=age, started_at=NOW - age, sizes=sizes or [[[1000]], [[1000]]])


def in_collective(r: int, seq: int, op: str = "gloo:all_reduce", age: float = 12.0, world: int = 4,
                  **kw: Any) -> RankState:
    group = CollectiveGroup(pg="0", seq=seq, size=world, backend="gloo", seq_changed_at=NOW - age,
                            pending=[pend(seq, op, age)])
    return rank(r, world, time=NOW, collectives=[group], **kw)


def at_seq(r: int, seq: int, world: int = 4, changed_ago: float = 12.0, **kw: Any) -> RankState:
    group = CollectiveGroup(pg="0", seq=seq, size=world, backend="gloo", seq_changed_at=NOW - changed_ago)
    return rank(r, world, time=NOW, collectives=[group], **kw)


# ------------------------------------------------------------------ healthy and structure


def test_healthy_job_has_no_finding() -> None:
    s, h = healthy()
    assert diagnose(s, h, NOW) == []


def test_every_finding_is_complete_and_sorted() -> None:
    states = [in_collective(r, 37, world=3) for r in range(3)] + [at_seq(3, 36, batches_per_epoch=1248)]
    replace = msgspec.structs.replace
    states[1] = replace(states[1], gpu=GpuInfo(index=0, name="A10G", compute_capability="8.6"))
    states[2] = replace(states[2], gpu=GpuInfo(index=0, name="T4", compute_capability="7.5"))
    found = diagnose(snap(states), {}, NOW)
    assert {"unequal_batches", "collective_stall", "gpu_heterogeneous"} <= set(kinds(found))
    order = {"critical": 2, "warning": 1, "info": 0}
    assert [order[f.severity] for f in found] == sorted((order[f.severity] for f in found), reverse=True)
    for f in found:
        assert f.kind in KINDS and f.ranks and f.title and "\n" not in f.title
        assert f.evidence and f.remedy
        assert any(ch.isdigit() for ch in " ".join(f.evidence)), f"no numbers in {f}"


def test_a_broken_rule_does_not_hide_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> list[Finding]:
        raise RuntimeError("bug")

    import ddptop.diagnosis.engine as engine

    monkeypatch.setattr(engine, "RULES", (boom, *RULES))
    states = [rank(0, 2), rank(1, 2, batches_per_epoch=1248)]
    assert "unequal_batches" in kinds(engine.diagnose(snap(states), {}, NOW))


def test_one_rank_job_is_quiet() -> None:
    alone = [in_collective(0, 5, world=1, age=120.0)]
    assert kinds(diagnose(snap(alone), {0: samples(wait=0.01)}, NOW), "warning") == []


def test_findings_for_model_reads_the_model() -> None:
    model = JobModel()
    for r, bpe in ((0, 1250), (1, 1248), (2, 1250)):
        model.apply(RecordEntry(time=NOW, rank=r, message=StateMsg(state=rank(r, 3, batches_per_epoch=bpe))))
        model.apply(HistoryMsg(rank=r, samples=samples()))
    assert only(findings_for_model(model, NOW), "unequal_batches").ranks == [1]


# ------------------------------------------------------------------ unequal_batches


def test_unequal_batches_names_every_count_before_any_hang() -> None:
    counts = {0: 1250, 1: 1248, 2: 1250, 3: 1250}
    states = [rank(r, batch=int(r != 2), step=int(r != 2), batches_per_epoch=n) for r, n in counts.items()]
    f = only(diagnose(snap(states), {}, NOW), "unequal_batches")
    assert f.severity == "critical" and f.ranks == [1]
    assert "desync" in f.title
    assert "rank 0: 1250, rank 1: 1248, rank 2: 1250, rank 3: 1250" in f.evidence[0]
    assert "seed" in f.remedy and "numpy" in f.remedy


def test_unequal_batches_cites_unseeded_numpy() -> None:
    states = [rank(0, 2, rng_fingerprint=RngFingerprint(epoch=0, torch="t", numpy="a")),
              rank(1, 2, batches_per_epoch=9, rng_fingerprint=RngFingerprint(epoch=0, torch="t", numpy="b"))]
    found = diagnose(snap(states), {}, NOW)
    assert any("numpy" in e for e in only(found, "unequal_batches").evidence)
    rng = only(found, "rng_divergence")
    assert rng.severity == "info" and "numpy" in rng.title and "torch" not in rng.title


def test_last_partial_batch_is_not_an_alarm() -> None:
    # Equal loader lengths; one rank is on the final, smaller batch (faster step, batch == length).
    states = [rank(r, batch=1249) for r in range(3)] + [rank(3, batch=1250, step_time_s=0.05)]
    h = {r: samples() for r in range(3)} | {3: [*samples()[:-1], samples(n=1, step_time=0.05)[0]]}
    assert kinds(diagnose(snap(states), h, NOW), "warning") == []


# ------------------------------------------------------------------ collectives


def test_collective_mismatch_same_seq_different_op() -> None:
    states = [in_collective(r, 1474236) for r in (0, 2, 3)]
    states.insert(1, in_collective(1, 1474236, op="gloo:all_gather"))
    found = diagnose(snap(states), {}, NOW)
    f = only(found, "collective_mismatch")
    assert f.severity == "critical" and f.ranks == [1]
    assert "ranks 0,2-3 in gloo:all_reduce #1474236" in f.title
    assert "rank 1 in gloo:all_gather #1474236" in f.title
    assert "collective_stall" not in kinds(found)  # the mismatch explains the wait


def test_collective_mismatch_same_op_different_sizes() -> None:
    states = [in_collective(r, 9, world=2) for r in range(2)]
    states[1].collectives[0].pending[0].sizes = [[[999]], [[999]]]
    # Two ranks alone that disagree: both, "cannot tell which" (#33's precision rule).
    f = only(diagnose(snap(states), {}, NOW), "collective_mismatch")
    assert (f.ranks, f.certain) == ([0, 1], False) and "cannot be told" in f.title, f
    states = [in_collective(r, 9, world=3) for r in range(3)]
    states[1].collectives[0].pending[0].sizes = [[[999]], [[999]]]
    f = only(diagnose(snap(states), {}, NOW), "collective_mismatch")
    assert (f.ranks, f.certain, f.victims) == ([1], True, [0, 2]), f


def test_collective_mismatch_waits_for_peers_that_could_turn_a_tie() -> None:
    """Seen in CI (F5): two of four ranks pending, one per side; the late two decide which is odd."""
    early = [in_collective(2, 102, op="gloo:all_gather", age=2.2), in_collective(3, 102, age=1.5)]
    quiet = [at_seq(r, 102, changed_ago=1.5) for r in (0, 1)]  # entered, pending op not read yet
    assert "collective_mismatch" not in kinds(diagnose(snap(early + quiet), {}, NOW))
    heard = early + [in_collective(r, 102, age=1.5) for r in (0, 1)]
    f = only(diagnose(snap(heard), {}, NOW), "collective_mismatch")
    assert f.ranks == [2] and "cannot be told" not in f.title and "not heard" not in f.title
    # Peers that never show a pending op do not hold the finding back past the stall threshold.
    old = [in_collective(2, 102, op="gloo:all_gather", age=6.0), in_collective(3, 102, age=6.0)]
    f = only(diagnose(snap(old + quiet), {}, NOW), "collective_mismatch")
    assert "2 of the group not heard from" in f.title


def test_collective_mismatch_two_against_two_says_it_cannot_tell() -> None:
    states = [in_collective(r, 7, op="gloo:all_gather" if r >= 2 else "gloo:all_reduce", age=0.5)
              for r in range(4)]
    f = only(diagnose(snap(states), {}, NOW), "collective_mismatch")
    assert (f.ranks, f.certain) == ([0, 1, 2, 3], False) and "which one diverged cannot be told" in f.title


def test_collective_stall_names_the_rank_that_never_entered() -> None:
    states = [in_collective(r, 37) for r in range(3)] + [at_seq(3, 36, changed_ago=20.0)]
    f = only(diagnose(snap(states), {}, NOW), "collective_stall")
    assert f.ranks == [3] and f.severity == "warning"
    assert "ranks 0-2 have waited 12.0s in gloo:all_reduce #37" in f.title
    assert any("rank 3 never entered it (seq 36" in e for e in f.evidence)


def test_collective_stall_says_not_heard_of_a_rank_last_seen_before_the_wait() -> None:
    """A rank behind whose newest state predates the wait (a silent rank, a lagging sender: seen
    in CI at 32,768 ranks) may have entered since: it is not said to have never entered it."""
    silent = msgspec.structs.replace(at_seq(2, 36, changed_ago=20.0), time=NOW - 15.0)
    states = [in_collective(r, 37) for r in (0, 1)] + [silent, at_seq(3, 36, changed_ago=20.0)]
    f = only(diagnose(snap(states), {}, NOW), "collective_stall")
    assert f.ranks == [2, 3]
    assert f.title.endswith("rank 3 never entered it; rank 2 not heard from since it began"), f.title
    assert any(e.startswith("rank 2 not heard from since it began (last state 15.0s ago: seq 36")
               for e in f.evidence), f.evidence
    # Heard once more after the wait began, still behind: now it never entered it.
    heard = msgspec.structs.replace(silent, time=NOW - 1.0)
    f = only(diagnose(snap([*states[:2], heard, states[3]]), {}, NOW), "collective_stall")
    assert f.title.endswith("ranks 2-3 never entered it"), f.title


def test_collective_stall_never_says_a_rank_it_never_heard_from_did_not_enter() -> None:
    """Ranks of the job this viewer has no state of (no record on this host, their host cut off)
    are named, as never heard from: whether they entered cannot be known here."""
    states = [in_collective(r, 37) for r in range(3)] + [at_seq(3, 36, changed_ago=20.0)]
    f = only(diagnose(snap(states, world=6, unreachable={4: "no discovery entry", 5: "no discovery entry"}),
                      {}, NOW), "collective_stall")
    assert f.ranks == [3, 4, 5]
    assert f.title.endswith("rank 3 never entered it; ranks 4-5 never heard from"), f.title


def test_stall_at_the_first_collective_with_one_rank_missing() -> None:
    states = [in_collective(r, 1, age=7.0) for r in range(3)] + [at_seq(3, 0, changed_ago=30.0)]
    f = only(diagnose(snap(states), {}, NOW), "collective_stall")
    assert f.ranks == [3] and "#1" in f.title


def test_stall_ages_with_the_clock() -> None:
    # Sampled 3 s ago at age 3 s: at NOW the ranks have waited 6 s, over the 5 s threshold.
    states = [msgspec.structs.replace(in_collective(r, 37, age=3.0), time=NOW - 3.0) for r in range(3)]
    states.append(at_seq(3, 36))
    assert "collective_stall" in kinds(diagnose(snap(states), {}, NOW))
    assert "collective_stall" not in kinds(diagnose(snap(states), {}, NOW - 2.0))


def test_a_young_wait_is_not_a_stall() -> None:
    states = [in_collective(r, 37, age=2.0) for r in range(3)] + [at_seq(3, 36, changed_ago=0.5)]
    assert kinds(diagnose(snap(states), {}, NOW), "info") == []


def test_stall_without_flight_recorder_uses_seq_age() -> None:
    states = [at_seq(r, 37, changed_ago=9.0) for r in range(3)] + [at_seq(3, 36, changed_ago=9.0)]
    assert only(diagnose(snap(states), {}, NOW), "collective_stall").ranks == [3]


def test_stall_names_a_crashed_peer() -> None:
    states = [in_collective(r, 37, world=3) for r in range(2)]
    states.append(rank(2, 3, status="crashed", exit_reason="signal 11 (SIGSEGV)", crash_file="/rt/j.2.crash"))
    found = diagnose(snap(states), {}, NOW)
    assert only(found, "collective_stall").severity == "critical"
    assert only(found, "rank_lost").ranks == [2]


def test_slow_checkpoint_save_is_quiet() -> None:
    # Every rank inside the same all-gather, 40 s old: a big save, not a hang.
    states = [in_collective(r, 5000, op="gloo:all_gather", age=40.0) for r in range(4)]
    assert kinds(diagnose(snap(states), {}, NOW), "info") == []


def test_all_ranks_stuck_for_long_is_reported() -> None:
    states = [in_collective(r, 5000, op="gloo:all_gather", age=90.0) for r in range(4)]
    f = only(diagnose(snap(states), {}, NOW), "collective_stall")
    assert f.ranks == [0, 1, 2, 3] and "1m30s" in f.title


def test_p2p_signature_first_collective_on_nccl() -> None:
    gpu = GpuInfo(index=0, name="H800", compute_capability="9.0", util_percent=100.0)
    states = [msgspec.structs.replace(in_collective(r, 1, op="nccl:all_reduce", age=95.0), backend="nccl",
                                      gpu=gpu) for r in range(8)]
    f = only(diagnose(snap(states), {}, NOW), "collective_stall")
    assert f.severity == "critical" and "first collective" in f.title
    assert "NCCL_P2P_DISABLE=1" in f.remedy
    assert any("GPU busy 100" in e for e in f.evidence)


def test_start_up_is_quiet() -> None:
    # Ranks still starting: no collective entered, no batches, one just answered.
    states = [rank(r, status="starting", start_time=NOW - 2, step=0, batch=0, batches_per_epoch=None,
                   collectives=[CollectiveGroup(pg="0", seq=0, seq_changed_at=NOW - 2)],
                   data_wait_fraction=None, step_time_s=None) for r in range(3)]
    found = diagnose(snap(states, world=4, unreachable={3: "no state received"}), {}, NOW)
    assert kinds(found, "warning") == []


def test_rank_that_just_restarted_is_not_judged() -> None:
    # Rank 2 was restarted 4 s ago: seq and step start from 0 again, its history is old.
    states = [rank(r) for r in (0, 1, 3)]
    states.insert(2, at_seq(2, 0, restart_count=1, start_time=NOW - 4, step=0, batch=0, changed_ago=4.0))
    h = {r: samples() for r in range(4)}
    h[2] = samples(step_time=1.0, wait=0.9, ready=0, end=NOW - 10)
    assert kinds(diagnose(snap(states), h, NOW), "warning") == []


# ------------------------------------------------------------------ progress


def test_straggler_by_step_time() -> None:
    s, h = healthy()
    h[2] = samples(step_time=0.5)
    f = only(diagnose(s, h, NOW), "straggler")
    assert f.ranks == [2] and any("0.500 s vs 0.200 s" in e for e in f.evidence)


def test_straggler_by_data_wait() -> None:
    s, h = healthy()
    h[1] = samples(wait=0.45, ready=1)
    f = only(diagnose(s, h, NOW), "straggler")
    assert f.ranks == [1] and any("45%" in e for e in f.evidence)


def test_one_slow_sample_is_not_a_straggler() -> None:
    s, h = healthy()
    h[2] = samples()[:-1] + samples(n=1, step_time=3.0)
    assert kinds(diagnose(s, h, NOW), "info") == []


def test_straggler_needs_history() -> None:
    s, h = healthy()
    h = {r: v[-3:] for r, v in h.items()}
    h[2] = samples(n=3, step_time=0.9)
    assert "straggler" not in kinds(diagnose(s, h, NOW))


def test_input_bound() -> None:
    s, h = healthy(2)
    h = {r: samples(wait=0.8, ready=0) for r in range(2)}
    f = only(diagnose(s, h, NOW), "input_bound")
    assert f.ranks == [0, 1] and "80%" in f.evidence[0]


def test_input_bound_not_when_the_queue_is_full() -> None:
    s, _ = healthy(2)
    h = {r: samples(wait=0.8, ready=6) for r in range(2)}
    assert "input_bound" not in kinds(diagnose(s, h, NOW))


# ------------------------------------------------------------------ system


def test_cpu_oversubscribed() -> None:
    states = [rank(r, host="node-3", loader_workers=4, cpu_count=12) for r in range(4)]
    f = only(diagnose(snap(states), {}, NOW), "cpu_oversubscribed")
    assert f.title == "num_workers 4 x 4 local ranks = 16 > 12 cores on node-3"
    assert "num_workers 4 -> 2" in f.remedy


def test_cpu_counts_per_host() -> None:
    states = [rank(r, host=f"node-{r // 2}", loader_workers=4, cpu_count=12) for r in range(4)]
    assert "cpu_oversubscribed" not in kinds(diagnose(snap(states), {}, NOW))


def test_shm_small_with_workers() -> None:
    states = [rank(r, 2, shm_total_bytes=64 << 20, shm_used_bytes=1 << 20) for r in range(2)]
    f = only(diagnose(snap(states), {}, NOW), "shm_pressure")
    assert f.severity == "warning" and "64.0M" in f.title


def test_shm_nearly_full() -> None:
    states = [rank(r, 2, shm_total_bytes=1 << 30, shm_used_bytes=int(0.97 * (1 << 30))) for r in range(2)]
    assert only(diagnose(snap(states), {}, NOW), "shm_pressure").severity == "critical"


def test_small_shm_without_workers_on_gloo_is_fine() -> None:
    states = [rank(r, 2, loader_workers=0, shm_total_bytes=64 << 20) for r in range(2)]
    assert "shm_pressure" not in kinds(diagnose(snap(states), {}, NOW))


def test_gpu_heterogeneous() -> None:
    states = [rank(r, gpu=GpuInfo(index=r, name="V100", compute_capability="7.0")) for r in range(4)]
    states[2] = rank(2, gpu=GpuInfo(index=2, name="GTX 1080", compute_capability="6.1"))
    f = only(diagnose(snap(states), {}, NOW), "gpu_heterogeneous")
    assert f.ranks == [2] and "6.1" in f.title


def test_version_mismatch() -> None:
    states = [rank(r, versions=Versions(python="3.11", torch="2.13.0", nccl="2.21.5")) for r in range(4)]
    states[3] = rank(3, versions=Versions(python="3.11", torch="2.13.0", nccl="2.10.3"))
    f = only(diagnose(snap(states), {}, NOW), "version_mismatch")
    assert f.ranks == [3] and "nccl" in f.title and "2.10.3 on rank 3" in f.evidence[0]


# ------------------------------------------------------------------ identity


def test_param_mismatch_names_first_differing_parameter() -> None:
    good = ParamFingerprint(count=2, numel=5994 * 192 + 192, shapes_hash="a",
                            shapes=[("embedding.weight", [5994, 192]), ("fc.bias", [192])])
    bad = ParamFingerprint(count=2, numel=192, shapes_hash="b",
                           shapes=[("embedding.weight", [0, 192]), ("fc.bias", [192])])
    states = [rank(r, param_fingerprint=good) for r in range(4)]
    states[2] = rank(2, param_fingerprint=bad)
    f = only(diagnose(snap(states), {}, NOW), "param_mismatch")
    assert f.ranks == [2] and f.severity == "critical"
    assert f.title == "rank 2: embedding.weight is [0, 192], others [5994, 192]"


def test_rng_divergence_torch_only() -> None:
    states = [rank(r, 2, rng_fingerprint=RngFingerprint(epoch=3, torch=f"t{r}", numpy="n")) for r in range(2)]
    f = only(diagnose(snap(states), {}, NOW), "rng_divergence")
    assert "torch" in f.title and "numpy" not in f.title and f.severity == "info"


def test_rng_compared_only_at_the_same_epoch() -> None:
    states = [rank(0, 2, rng_fingerprint=RngFingerprint(epoch=3, torch="a")),
              rank(1, 2, rng_fingerprint=RngFingerprint(epoch=4, torch="b"))]
    assert "rng_divergence" not in kinds(diagnose(snap(states), {}, NOW))


def test_rank_lost_crash_with_signal_and_crash_file() -> None:
    states = [rank(r) for r in (0, 1, 3)]
    states.insert(2, rank(2, status="crashed", exit_reason="signal 11 (SIGSEGV)", crash_file="/rt/j.2.crash",
                          step=0, time=NOW))
    h = {r: samples() for r in range(4)}
    f = only(diagnose(snap(states), h, NOW), "rank_lost")
    assert f.ranks == [2] and f.severity == "critical" and "SIGSEGV" in f.title
    assert any("/rt/j.2.crash" in e and "step 495" in e for e in f.evidence)
    assert "compute capability" in f.remedy


def test_rank_lost_first_to_die_named() -> None:
    states = [rank(r, 2, status="crashed", exit_reason="signal 11 (SIGSEGV)", time=NOW) for r in range(2)]
    h = {0: samples(end=NOW - 1), 1: samples(end=NOW - 5)}
    f = only(diagnose(snap(states), h, NOW), "rank_lost")
    assert f.ranks == [1, 0] and "rank 1 was the first to go silent" in f.evidence


def test_lost_without_last_words() -> None:
    states = [rank(0, 2), rank(1, 2, status="lost")]
    f = only(diagnose(snap(states), {}, NOW), "rank_lost")
    assert f.ranks == [1] and f.severity == "critical"


def test_clean_exit_at_the_end_is_not_a_warning() -> None:
    states = [rank(0, 2), rank(1, 2, status="exited")]
    found = diagnose(snap(states), {}, NOW)
    assert kinds(found, "warning") == [] and only(found, "rank_lost").severity == "info"
    done = [rank(r, 2, status="exited") for r in range(2)]
    assert diagnose(snap(done), {}, NOW) == []


def test_thresholds_come_from_config() -> None:
    states = [in_collective(r, 37, age=7.0) for r in range(3)] + [at_seq(3, 36)]
    assert "collective_stall" in kinds(diagnose(snap(states), {}, NOW))
    assert "collective_stall" not in kinds(diagnose(snap(states), {}, NOW, DiagnosisConfig(stall_s=8.0)))


def test_unequal_batches_without_a_majority_names_every_rank() -> None:
    states = [rank(r, batches_per_epoch=c, batch=10) for r, c in enumerate((67, 44, 63, 65))]
    f = only(diagnose(snap(states), {}, NOW), "unequal_batches")
    assert f.ranks == [0, 1, 2, 3]
    assert "rank 1 runs out after 44 batches" in f.evidence[1]
    # At its last batch: "out now", never "about 0ms".
    states = [rank(r, batches_per_epoch=c, batch=44 if r == 1 else 10)
              for r, c in enumerate((67, 44, 63, 65))]
    f = only(diagnose(snap(states), {}, NOW), "unequal_batches")
    assert "0 left in epoch" in f.evidence[1] and "out now" in f.evidence[1] and "0ms" not in f.evidence[1]


@pytest.mark.parametrize("times", [[], [5.0], [1.0, 2.0, 2.0, 3.0, 7.5], list(range(0, 700, 1))])
def test_recent_samples_equals_a_plain_filter(times: list[float]) -> None:
    """The binary-search tail copy agrees with filtering, for lists and deques, at every cut."""
    samples = [Sample(time=float(t), step=i, epoch=0, batch=i, seq=i, step_time_s=None,
                      data_wait_fraction=None, loader_ready_batches=None, cpu_percent=None,
                      rss_bytes=None, gpu_util_percent=None) for i, t in enumerate(times)]
    cuts = sorted({*times, -1.0, 1e9, *(t + 0.5 for t in times[:20])})
    for since in cuts:
        expected = [s for s in samples if s.time >= since]
        assert recent_samples(samples, since) == expected
        assert recent_samples(deque(samples, maxlen=3600), since) == expected


def test_recent_samples_while_another_thread_appends() -> None:
    """The background diagnosis reads deques the UI thread appends to: never an exception,
    always the right window (the GIL switched every 10 us to provoke interleaving)."""
    history: deque[Sample] = deque(maxlen=600)

    def sample(t: float) -> Sample:
        return Sample(time=t, step=int(t), epoch=0, batch=0, seq=0, step_time_s=None,
                      data_wait_fraction=None, loader_ready_batches=None, cpu_percent=None,
                      rss_bytes=None, gpu_util_percent=None)

    for t in range(600):
        history.append(sample(float(t)))
    stop = threading.Event()

    def writer() -> None:
        t = 600.0
        while not stop.is_set():
            history.append(sample(t))
            t += 1.0

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 1.5
        calls = 0
        while time.monotonic() < deadline:
            newest = history[-1].time
            tail = recent_samples(history, newest - 50)
            assert tail and all(s.time >= newest - 50 for s in tail)
            assert all(a.time < b.time for a, b in itertools.pairwise(tail))
            calls += 1
        assert calls > 100
    finally:
        stop.set()
        thread.join(timeout=5)
        sys.setswitchinterval(old)


# ------------------------------------------------------------------ what bench/mutation.py found
# Each test kills mutants of ddptop/diagnosis/rules_progress.py that survived mutmut (numbers
# are mutmut's, per function): the findings were right, but no test read these parts.


def test_unequal_batches_says_numpy_differs_only_when_it_does() -> None:
    """The numpy note counts the distinct states, and is absent when every rank's numpy state
    is alike (_numpy_rng_note #3, #5, #6: `>` -> `>=`, the count -> None, "" -> "XXXX")."""
    alike = [rank(0, 3), rank(1, 3, batches_per_epoch=9), rank(2, 3)]
    f = only(diagnose(snap(alike), {}, NOW), "unequal_batches")
    assert [e.split(":")[0] for e in f.evidence] == ["batches per epoch"]
    differ = [rank(r, 3, batches_per_epoch=9 if r == 1 else 1250,
                   rng_fingerprint=RngFingerprint(epoch=1, torch="t", numpy="ab"[r % 2])) for r in range(3)]
    f = only(diagnose(snap(differ), {}, NOW), "unequal_batches")
    assert "numpy RNG state differs across ranks (2 distinct): numpy was not seeded alike" in f.evidence


def test_straggler_remedy_points_at_data_loading_or_at_the_host() -> None:
    """A straggler waiting for data (its last share over 30%) is told about its loader; another
    about its host (_straggler_remedy #1-#6: `and` -> `or`, `>` -> `>=`, 0.3 -> 1.3, the texts)."""
    s, h = healthy()
    s = snap([rank(r, data_wait_fraction=0.45 if r == 1 else 0.05) for r in range(4)])
    h[1] = samples(wait=0.45, ready=1)
    f = only(diagnose(s, h, NOW), "straggler")
    assert f.remedy.startswith("rank 1 is slow to load data on node-0: check that host's CPU load and disk")
    assert "(num_workers now 2)" in f.remedy
    for wait in (0.3, None):
        s = snap([rank(r, data_wait_fraction=wait if r == 2 else 0.05) for r in range(4)])
        h = {r: samples(step_time=0.5 if r == 2 else 0.2) for r in range(4)}
        f = only(diagnose(s, h, NOW), "straggler")
        assert f.remedy.startswith("check rank 2's host node-0 (CPU/GPU load"), (wait, f.remedy)
        assert f.remedy.endswith("and whether its batches are larger (sort or bucket by length alike on "
                                 "every rank)"), f.remedy
    # Waiting for data over the window, whatever its latest sample says: the loader's advice.
    s = snap([rank(r, data_wait_fraction=0.05) for r in range(4)])
    h = {r: samples(wait=0.45 if r == 3 else 0.05, ready=1) for r in range(4)}
    f = only(diagnose(s, h, NOW), "straggler")
    assert f.remedy.startswith("rank 3 is slow to load data on node-0"), f.remedy


def test_a_victim_seen_before_the_rank_that_went_is_not_named_as_the_cause() -> None:
    """Rank 1 segfaulted, but this look saw only rank 2's end ("Connection closed by peer":
    a peer was gone) while 0 and 1 still show running (rank 1's exit comes a moment later on a
    loaded machine, seen in CI): no rank is named, rank 2 is a victim, and it says why."""
    states = [rank(r, 3) for r in range(2)]
    states.append(rank(2, 3, status="crashed", time=NOW,
                       exit_reason="RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                                   "[127.0.0.1]:5417"))
    f = only(diagnose(snap(states), {r: samples() for r in range(3)}, NOW, DiagnosisConfig()), "rank_lost")
    assert f.ranks == [] and f.victims == [2] and not f.certain and f.severity == "critical", f
    assert "which one went is not seen yet" in f.title, f
    # Once rank 1's end is seen, it is named first and rank 2 is its victim.
    states[1] = rank(1, 3, status="crashed", exit_reason="signal 11 (SIGSEGV)", time=NOW - 0.5)
    f = only(diagnose(snap(states), {r: samples() for r in range(3)}, NOW, DiagnosisConfig()), "rank_lost")
    assert f.ranks[0] == 1 and f.certain and 2 in f.victims, f
