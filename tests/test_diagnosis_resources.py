"""memory_exhaustion, shm_exhaustion, disk_exhaustion on constructed jobs: each limit foreseen with
its rate, ETA (as a clock time) and the ranks that share it; quiet on a sawtooth, a warm-up that
levels off, and a limit far away."""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec
import pytest

from ddptop.diagnosis import DiagnosisConfig, diagnose
from ddptop.diagnosis.finding import Finding
from ddptop.protocol import GpuInfo, Sample
from tests.test_diagnosis_rules import NOW, kinds, only, rank, samples, snap

MIB = 1 << 20
GIB = 1 << 30
EXHAUSTION = {"memory_exhaustion", "shm_exhaustion", "disk_exhaustion"}


def history(value: Any, field: str, n: int = 40) -> list[Sample]:
    """The healthy rate samples of test_diagnosis_rules, *field* set to value(i, t) (t: 0..n-1 s)."""
    out = samples(n=n)
    return [msgspec.structs.replace(x, **{field: int(value(i, float(i)))}) for i, x in enumerate(out)]


def leak_job(field: str, value: Any, world: int = 4, **state: Any) -> tuple[Any, dict[int, list[Sample]]]:
    states = [rank(r, world, **state) for r in range(world)]
    return snap(states), {r: history(value, field) for r in range(world)}


def exhaustion(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.kind in EXHAUSTION]


CGROUP = dict(cgroup_path="/kubepods/pod7/ctr", cgroup_memory_limit_bytes=4 * GIB,
              cgroup_memory_bytes=3 * GIB)


def test_a_cgroup_filling_up_is_foreseen_with_rate_limit_eta_and_who_shares_it() -> None:
    # +8 MiB/s with a 40 MiB sawtooth: 3.3 GiB at the newest sample, 4 GiB limit: ~90 s left
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 8 * MIB * t + (i % 3) * 20 * MIB, **CGROUP)
    f = only(diagnose(s, h, NOW), "memory_exhaustion")
    assert f.severity == "critical"  # under two minutes
    assert f.ranks == [0, 1, 2, 3]
    fc = f.forecast
    assert fc is not None and fc.resource == "cgroup memory" and fc.where == "/kubepods/pod7/ctr"
    assert fc.limit_bytes == 4 * GIB and fc.shared_by == [0, 1, 2, 3]
    assert fc.rate_bytes_per_s == pytest.approx(8 * MIB, rel=0.15)
    assert fc.eta_s == pytest.approx((4 * GIB - fc.used_bytes) / fc.rate_bytes_per_s)
    assert fc.reaches_at == pytest.approx(fc.at + fc.eta_s)
    clock = time.strftime("%H:%M:%S", time.localtime(fc.reaches_at))
    assert clock in f.title and "memory cgroup /kubepods/pod7/ctr on node-0" in f.title
    assert any("shared by ranks 0-3" in e for e in f.evidence)


def test_the_fastest_rising_rank_is_named_in_a_shared_cgroup() -> None:
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 8 * MIB * t, **CGROUP)
    h[2] = [msgspec.structs.replace(x, rss_bytes=GIB + 8 * MIB * i) for i, x in enumerate(h[2])]
    f = only(diagnose(s, h, NOW), "memory_exhaustion")
    assert "rank 2's RSS rising 8.0M/s" in f.evidence


def test_warning_when_the_limit_is_minutes_away_and_nothing_when_it_is_hours_away() -> None:
    slow = dict(CGROUP, cgroup_memory_limit_bytes=3 * GIB + 3 * 1024 * MIB)  # ~3 GiB left at 1 MiB/s
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 4 * MIB * t, **slow)
    f = only(diagnose(s, h, NOW), "memory_exhaustion")
    assert f.severity == "warning" and 120 < f.forecast.eta_s < 900  # type: ignore[union-attr]
    far = dict(CGROUP, cgroup_memory_limit_bytes=64 * GIB)
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 4 * MIB * t, **far)
    assert not exhaustion(diagnose(s, h, NOW))


@pytest.mark.parametrize("shape", ["sawtooth", "warm-up", "flat"])
def test_quiet_on_a_sawtooth_a_warm_up_and_a_level(shape: str) -> None:
    value = {
        "sawtooth": lambda i, t: 3 * GIB + (i % 4) * 200 * MIB,
        "warm-up": lambda i, t: 2 * GIB + 60 * MIB * min(t, 12.0) + (i % 2) * 30 * MIB,
        "flat": lambda i, t: 3800 * MIB,
    }[shape]
    s, h = leak_job("cgroup_memory_bytes", value, **CGROUP)
    assert not exhaustion(diagnose(s, h, NOW))


def test_no_cgroup_limit_means_no_cgroup_finding() -> None:
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 8 * MIB * t,
                    **dict(CGROUP, cgroup_memory_limit_bytes=None))
    assert not exhaustion(diagnose(s, h, NOW))


def test_host_memory_filling_up() -> None:
    s, h = leak_job("host_memory_used_bytes", lambda i, t: 15 * GIB + 20 * MIB * t,
                    mem_total_bytes=16 * GIB, mem_available_bytes=GIB)
    f = only(diagnose(s, h, NOW), "memory_exhaustion")
    assert f.forecast is not None and f.forecast.resource == "host memory" and f.forecast.where == "node-0"


def test_gpu_memory_filling_up_is_per_device() -> None:
    states = [rank(r, 2, gpu=GpuInfo(index=r, mem_total_bytes=80 * GIB)) for r in range(2)]
    h = {0: history(lambda i, t: 70 * GIB + 100 * MIB * t, "gpu_mem_used_bytes"),
         1: history(lambda i, t: 40 * GIB, "gpu_mem_used_bytes")}
    f = only(diagnose(snap(states), h, NOW), "memory_exhaustion")
    assert f.ranks == [0] and f.forecast is not None and f.forecast.where == "gpu0"


def test_dev_shm_filling_up_is_one_finding_per_host() -> None:
    states = [rank(r, 4, host=f"node-{r // 2}", shm_total_bytes=64 * MIB, shm_used_bytes=40 * MIB)
              for r in range(4)]
    grow = history(lambda i, t: 10 * MIB + MIB * t, "shm_used_bytes")
    flat = history(lambda i, t: 10 * MIB, "shm_used_bytes")
    h = {0: grow, 1: grow, 2: flat, 3: flat}
    found = exhaustion(diagnose(snap(states), h, NOW))
    assert [(f.kind, f.ranks) for f in found] == [("shm_exhaustion", [0, 1])]
    assert "/dev/shm on node-0" in found[0].title


def test_a_checkpoint_disk_filling_up() -> None:
    # a checkpoint every 10 s, its temporary file beside the last one for a second
    def value(i: int, t: float) -> float:
        return 900 * MIB + (10 * MIB if i % 10 == 9 else 0) + 2 * MIB * t

    s, h = leak_job("disk_used_bytes", value, disk_path="/ckpt/run1", disk_mount="/ckpt",
                    disk_total_bytes=GIB)
    f = only(diagnose(s, h, NOW), "disk_exhaustion")
    assert f.forecast is not None and f.forecast.where == "/ckpt"
    assert "the filesystem of /ckpt on node-0" in f.title


def test_ended_ranks_are_not_forecast() -> None:
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 8 * MIB * t,
                    **dict(CGROUP, status="exited"))
    assert "memory_exhaustion" not in kinds(diagnose(s, h, NOW))


def test_thresholds_come_from_the_config() -> None:
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 8 * MIB * t, **CGROUP)
    config = DiagnosisConfig(exhaustion_warning_s=30.0, exhaustion_critical_s=10.0)
    assert not exhaustion(diagnose(s, h, NOW, config))




def _dead_of_oom(history_value: Any, died_at: float, n: int = 200) -> tuple[Any, dict[int, list[Sample]]]:
    limit = 4 * GIB
    dead = rank(1, 2, status="crashed", exit_signal="SIGKILL", exit_cause="oom_kill", exited_at=died_at,
                cgroup_path="/job", cgroup_memory_limit_bytes=limit, cgroup_memory_bytes=limit,
                memory_limit_bytes=limit)
    alive = rank(0, 2)
    h = history(history_value, "cgroup_memory_bytes", n=n)
    h = [msgspec.structs.replace(x, time=died_at - (n - i)) for i, x in enumerate(h)]
    return snap([alive, dead]), {0: samples(), 1: h}


def test_the_post_mortem_says_since_when_the_oom_kill_was_foreseen() -> None:
    # flat at 1 GiB for 100 s, then +30 MiB/s: 4 GiB after ~100 s more; the kill at the limit
    died_at = NOW - 5

    def value(i: int, t: float) -> float:
        return min(4 * GIB, GIB + 30 * MIB * max(0.0, t - 100))

    s, h = _dead_of_oom(value, died_at)
    f = only(diagnose(s, h, NOW), "rank_lost")
    told = [e for e in f.evidence if "foreseen" in e]
    assert len(told) == 1, f.evidence
    # the live rule warns once 20 s of the rise are seen: 70-80 s before the kill
    seen = re.search(r"foreseen (\d+)m(\d+)s before, at \d\d:\d\d:\d\d", told[0])
    assert seen is not None, told
    assert 60 <= int(seen[1]) * 60 + int(seen[2]) <= 85, told
    assert "its memory cgroup was then due to be full in about" in told[0]


def test_no_foresight_claimed_for_a_sudden_oom() -> None:
    died_at = NOW - 5
    s, h = _dead_of_oom(lambda i, t: GIB, died_at)
    f = only(diagnose(s, h, NOW), "rank_lost")
    assert not [e for e in f.evidence if "foreseen" in e]


def test_a_ranks_first_seconds_are_not_judged() -> None:
    # a steady rise since the rank started 25 s ago: its start-up and warm-up, not yet a trend
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 8 * MIB * t,
                    **dict(CGROUP, start_time=NOW - 25))
    assert not exhaustion(diagnose(s, h, NOW))
    s, h = leak_job("cgroup_memory_bytes", lambda i, t: 3 * GIB + 8 * MIB * t,
                    **dict(CGROUP, start_time=NOW - 70))  # 40 s of it are past its first 30 s
    assert kinds(exhaustion(diagnose(s, h, NOW))) == ["memory_exhaustion"]


HOST = dict(mem_total_bytes=16 * GIB, mem_available_bytes=GIB)


def test_host_memory_filled_by_other_processes_names_no_rank() -> None:
    # the host rises 20 MiB/s; every rank's RSS is flat at 1 GiB (the rate samples' own)
    s, h = leak_job("host_memory_used_bytes", lambda i, t: 15 * GIB + 20 * MIB * t, **HOST)
    f = only(diagnose(s, h, NOW), "memory_exhaustion")
    assert f.ranks == []
    assert f.forecast is not None and f.forecast.shared_by == [0, 1, 2, 3]
    assert "the job's ranks are flat: other processes (their DataLoader workers' among them?) grow 20.0M/s" \
        in f.title, f.title


def test_host_memory_names_the_ranks_whose_own_memory_grows() -> None:
    s, h = leak_job("host_memory_used_bytes", lambda i, t: 15 * GIB + 20 * MIB * t, **HOST)
    h[3] = [msgspec.structs.replace(x, rss_bytes=GIB + 18 * MIB * i) for i, x in enumerate(h[3])]
    f = only(diagnose(s, h, NOW), "memory_exhaustion")
    assert f.ranks == [0, 1, 2, 3] and "other processes" not in f.title
    assert "rank 3's RSS rising 18.0M/s" in f.evidence
    # a rank growing a part, the rest elsewhere: that rank named, and the others' share said
    h[3] = [msgspec.structs.replace(x, rss_bytes=GIB + 3 * MIB * i) for i, x in enumerate(h[3])]
    f = only(diagnose(s, h, NOW), "memory_exhaustion")
    assert f.ranks == [3] and "the job's ranks grow 3.0M/s of it: other processes" in f.title, f.title
    # a Python heap's creep is no cause: nobody named
    h[3] = [msgspec.structs.replace(x, rss_bytes=GIB + 100_000 * i) for i, x in enumerate(h[3])]
    f = only(diagnose(s, h, NOW), "memory_exhaustion")
    assert f.ranks == [] and "the job's ranks are flat" in f.title, f.title


def test_an_oom_kill_in_a_cgroup_the_rank_was_moved_into_names_it_and_its_limit() -> None:
    # the node agent read no limit (the rank's first cgroup had none); the rank's own last
    # state read the cgroup it was moved into
    died_at = NOW - 5
    s, h = _dead_of_oom(lambda i, t: min(1.5 * GIB, GIB + 10 * MIB * t), died_at)
    dead = msgspec.structs.replace(s.by_rank()[1], memory_limit_bytes=None, memory_peak_bytes=5 * GIB,
                                   cgroup_path="/moved", cgroup_memory_limit_bytes=int(1.5 * GIB))
    f = only(diagnose(snap([s.by_rank()[0], dead]), h, NOW), "rank_lost")
    assert "the cgroup limit 1.5G of /moved" in f.title, f.title


def test_a_rank_that_raised_beside_its_full_cgroup_is_told_by_the_cgroup() -> None:
    dead = rank(1, 2, status="crashed", exit_code=1, exited_at=NOW - 1, time=NOW - 2, cgroup_path="/job",
                cgroup_memory_limit_bytes=4 * GIB, cgroup_memory_bytes=4 * GIB - MIB,
                exit_reason="RuntimeError: std::bad_alloc")
    f = only(diagnose(snap([rank(0, 2), dead]), {0: samples(), 1: samples()}, NOW), "rank_lost")
    assert "its memory cgroup /job was full: 4.0G of 4.0G at the last sample" in f.title, f.title
    assert "std::bad_alloc" in f.title
    # a stop from outside is told as a stop, whatever was full
    stopped = msgspec.structs.replace(dead, exit_signal="SIGTERM", status="terminated")
    f = only(diagnose(snap([rank(0, 2), stopped]), {0: samples(), 1: samples()}, NOW), "rank_lost")
    assert "was full" not in f.title
