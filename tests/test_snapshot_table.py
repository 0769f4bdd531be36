"""``ddptop snapshot``'s table adapts to the width it is printed in (80 columns when piped).

Rendered by rich for real, into a string, from a snapshot made by ``build_snapshot`` as a live
one is (four answering ranks with a pending collective, one that did not answer).
"""

from __future__ import annotations

import io

from rich.console import Console

from ddptop.cli.snapshot import ALWAYS, COLUMNS, render_table
from ddptop.model.snapshot import build_snapshot
from ddptop.protocol import CollectiveGroup, GpuInfo, PendingOp, RankState

NOW = 1_800_000_000.0


def _snapshot() -> object:
    host = "gpu-node-017.cluster.example.org"
    states = [RankState(rank=r, local_rank=r, world_size=5, host=host, pid=41000 + r, job_id="wide",
                        time=NOW - 0.3, step=12345 + r, epoch=3, batch=417, batches_per_epoch=1250,
                        data_wait_fraction=0.12, loader_ready_batches=4, cpu_percent=187.0, rss_bytes=7 << 30,
                        shm_used_bytes=3 << 30, shm_total_bytes=64 << 30, backend="gloo",
                        gpu=GpuInfo(index=r, util_percent=97.0),
                        collectives=[CollectiveGroup(pg="0", seq=98765, pending=[
                            PendingOp(seq=98765, op="gloo:all_reduce", age_s=12.0)])])
              for r in range(4)]
    return build_snapshot("wide", 5, states, {4: "rank 4 at 10.0.0.9:41234: timed out"}, NOW)


def _render(width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(render_table(_snapshot(), NOW, width))  # type: ignore[arg-type]
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_at_80_columns_what_matters_stays_whole() -> None:
    text = _render(80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    for r in range(4):
        assert any(f"{12345 + r}" in line and "98765" in line and "running" in line
                   for line in text.splitlines()), text
    assert text.count("gloo:all_reduce #98765 12.0s") == 4, text
    assert "unreachable" in text and "rank 4 at 10.0.0.9:41234: timed" in text, text  # the reason wraps
    assert "…" not in text, text  # nothing cut: columns that do not fit are left out whole


def test_a_wide_terminal_shows_every_column() -> None:
    text = _render(220)
    header = next(line for line in text.splitlines() if "rank" in line and "status" in line)
    assert all(col in header for col in COLUMNS), header
    narrow = next(line for line in _render(80).splitlines() if "rank" in line and "status" in line)
    assert all(col in narrow for col in COLUMNS[:ALWAYS]) and "shm" not in narrow, narrow
