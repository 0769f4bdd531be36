"""The detail screen's limits: each resource a rank can run out of, its history drawn against its limit.

A sparkline scaled from zero to the limit (not from the history's own low to high, as the
rate sparklines are): a line that climbs to the top row is a resource about to run out, and
one that stays low is not, however much it moves. Pure: a rank's state and history in, lines out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ddptop.protocol import RankState, Sample
from ddptop.textfmt import human_bytes

BLOCKS = "▁▂▃▄▅▆▇█"
WIDTH = 60


def against_limit(values: Sequence[float | None], limit: float, width: int = WIDTH) -> str:
    """The last *width* values as blocks from 0 (▁) to *limit* (█); '·' where one is missing."""
    top = len(BLOCKS) - 1
    return "".join("·" if v is None else BLOCKS[max(0, min(top, int(v / limit * top)))]
                   for v in list(values)[-width:])


Row = tuple[str, Callable[[Sample], int | None], int | None, int | None]


def limit_lines(st: RankState, history: Sequence[Sample]) -> list[str]:
    """One line per limited resource the rank reports: name, sparkline, use of limit."""
    gpu = st.gpu
    rows: list[Row] = [
        ("cgroup mem", lambda x: x.cgroup_memory_bytes, st.cgroup_memory_bytes, st.cgroup_memory_limit_bytes),
        ("host mem  ", lambda x: x.host_memory_used_bytes,
         (st.mem_total_bytes - st.mem_available_bytes) if st.mem_total_bytes and st.mem_available_bytes
         is not None else None, st.mem_total_bytes),
        ("gpu mem   ", lambda x: x.gpu_mem_used_bytes, gpu.mem_used_bytes if gpu else None,
         gpu.mem_total_bytes if gpu else None),
        ("/dev/shm  ", lambda x: x.shm_used_bytes, st.shm_used_bytes, st.shm_total_bytes),
        ("disk      ", lambda x: x.disk_used_bytes, st.disk_used_bytes, st.disk_total_bytes),
    ]
    out: list[str] = []
    for name, used, now, limit in rows:
        if not limit or now is None:
            continue
        line = against_limit([used(x) for x in history], float(limit))
        out.append(f"{name} {line}  {human_bytes(now)} of {human_bytes(limit)} ({now / limit:.0%})")
    if st.cgroup_path and st.cgroup_memory_limit_bytes:
        out.append(f"cgroup {st.cgroup_path}")
    if st.disk_path:
        out.append(f"checkpoints {st.disk_path} (on {st.disk_mount or '?'})")
    return out
