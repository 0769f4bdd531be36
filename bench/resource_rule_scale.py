"""What ``rules_resources.resource_exhaustion`` costs at 32,768 ranks (8 a host, 4,096 hosts).

Run: ``.venv/bin/python bench/resource_rule_scale.py [--ranks 32768] [--repeat 3]``. Two
constructed jobs, each rank with 41 samples (the window the rate rules get): every host's
limits level (a 4 GiB sawtooth on its cgroup: the ETA bound ends each limit in C), and every
host's cgroup rising towards its limit (a trend, a finding and its RSS risers per host: the
worst case); and every host's disk judged by its saves (#55). Process CPU time, median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.memo import one_diagnosis
from ddptop.diagnosis.rules_resources import resource_exhaustion
from ddptop.model.snapshot import JobSnapshot, build_snapshot
from ddptop.protocol import RankState, Sample

GIB, MIB = 1 << 30, 1 << 20
NOW = 1_000_000.0


def build(n: int, rising: bool, saves: bool = False) -> tuple[JobSnapshot, dict[int, list[Sample]]]:
    """*n* running ranks, 8 a host, and their last 41 samples (*saves*: each host's first rank
    has kept 32 levels of its disk, a 40 GiB save a minute: judged by its saves, #55)."""
    states, hists = [], {}
    levels = [(NOW - 60.0 * (32 - k), 1024 * GIB + k * 40 * GIB) for k in range(32)]
    for r in range(n):
        states.append(RankState(
            rank=r, local_rank=r % 8, world_size=n, host=f"h{r // 8}", pid=r, status="running", time=NOW,
            start_time=NOW - 600, mem_total_bytes=256 * GIB, mem_available_bytes=180 * GIB,
            shm_used_bytes=256 * MIB, shm_total_bytes=32 * GIB, cgroup_path="/job",
            cgroup_memory_limit_bytes=240 * GIB, disk_path="/ckpt", disk_mount="/ckpt",
            disk_total_bytes=8192 * GIB, disk_used_bytes=2048 * GIB,
            disk_levels=levels if saves and r % 8 == 0 else []))
        hists[r] = [Sample(
            time=NOW - 40 + i, step=i, epoch=0, batch=i, seq=i, step_time_s=0.2, data_wait_fraction=0.0,
            loader_ready_batches=2, cpu_percent=100.0, rss_bytes=2 * GIB, gpu_util_percent=None,
            cgroup_memory_bytes=230 * GIB + i * 200 * MIB if rising else (20 + i % 4) * GIB,
            host_memory_used_bytes=76 * GIB + (i % 3) * 256 * MIB, shm_used_bytes=256 * MIB,
            disk_used_bytes=2048 * GIB) for i in range(41)]
    return build_snapshot("j", n, states, {}, NOW), hists


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=32768)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for rising, saves in ((False, False), (True, False), (False, True)):
        snapshot, histories = build(args.ranks, rising, saves)
        times: list[float] = []
        for _ in range(args.repeat):
            start = time.process_time()
            with one_diagnosis():
                found = resource_exhaustion(snapshot, histories, NOW, DiagnosisConfig())
            times.append(time.process_time() - start)
        what = "every host cgroup rising" if rising else "every host's disk saving" if saves else \
            "every limit level"
        print(f"{args.ranks} ranks, {what}: "
              f"{statistics.median(times) * 1e3:.0f} ms CPU (median of {args.repeat}), {len(found)} findings")


if __name__ == "__main__":
    main()
