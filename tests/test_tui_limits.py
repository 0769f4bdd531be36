"""The detail screen's limits section: each resource's history drawn from zero to its limit."""

from __future__ import annotations

from ddptop.protocol import RankState, Sample
from ddptop.tui.limits_text import against_limit, limit_lines

MIB = 1 << 20


def test_the_line_is_scaled_to_the_limit_not_to_its_own_range() -> None:
    assert against_limit([0, 50, 100, None, 200], 100.0) == "▁▄█·█"
    # a resource that moves a lot but stays far below its limit stays on the bottom rows
    assert set(against_limit([10, 11, 10, 12], 100.0)) == {"▁"}


def test_one_line_per_known_limit_with_use_of_limit() -> None:
    st = RankState(rank=1, local_rank=1, world_size=2, host="h", pid=1, cgroup_path="/job",
                   cgroup_memory_bytes=768 * MIB, cgroup_memory_limit_bytes=1024 * MIB,
                   shm_used_bytes=10 * MIB, shm_total_bytes=None, disk_path="/ckpt/run", disk_mount="/ckpt",
                   disk_used_bytes=None, disk_total_bytes=None)
    hist = [Sample(time=float(i), step=i, epoch=0, batch=i, seq=i, step_time_s=None, data_wait_fraction=None,
                   loader_ready_batches=None, cpu_percent=None, rss_bytes=None, gpu_util_percent=None,
                   cgroup_memory_bytes=(256 + 128 * i) * MIB) for i in range(5)]
    lines = limit_lines(st, hist)
    assert lines[0] == "cgroup mem ▂▃▄▅▆  768.0M of 1.0G (75%)"
    assert lines[1:] == ["cgroup /job", "checkpoints /ckpt/run (on /ckpt)"]  # no shm or disk limit known
