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


def test_every_rank_is_listed_the_silent_one_with_its_last_state() -> None:
    """#34 item 1: a rank that did not answer appears with its last known state, its status
    and why it did not answer (its age, where it is); one nothing is known of, as a stub."""
    from ddptop.cli.snapshot import snapshot_rows
    from ddptop.model.snapshot import JobInfo, JobSnapshot, with_last_known
    from ddptop.protocol import FrameStack, RankState, StuckReport

    now = 1_000_000.0
    live = JobSnapshot(job=JobInfo(id="j", world_size=3, time=now, unreachable={
        1: "rank 1: no answer within 5 s", 2: "rank 2: no answer within 5 s"}), ranks=[
        RankState(rank=0, local_rank=0, world_size=3, host="h", pid=10, time=now, step=10)])
    wedge = FrameStack(file="/work/probes/rank_dies.py", line=70, function="wedge")
    known = {1: RankState(rank=1, local_rank=1, world_size=3, host="h", pid=11, time=now - 30, step=10,
                          status="running", stuck=StuckReport(rank=1, pid=11, time=now, since=now - 30,
                                                              source="py-spy", frames=[wedge]))}
    snap = with_last_known(live, known, 3, now)
    assert [(s.rank, s.status) for s in snap.ranks] == [(0, "running"), (1, "stale"), (2, "unreachable")]
    assert snap.ranks[1].step == 10 and snap.ranks[1].stuck is not None
    why = snap.job.unreachable[1]
    assert "last state 30 s ago, at step 10" in why and "probes/rank_dies.py:70 in wedge" in why, why
    rows = snapshot_rows(snap)
    assert [r["rank"] for r in rows] == ["0", "1", "2"]  # one row per rank, no duplicate
    assert rows[1]["status"] == "stale" and "last state 30 s ago" in rows[1]["pending"], rows[1]
