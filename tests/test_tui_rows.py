"""Pure tests of rank-table rows, sorting, filtering, desync marks and fallback findings."""

from __future__ import annotations

from ddptop.diagnosis import desync
from ddptop.protocol import HistoryMsg, RecordEntry, StateMsg
from ddptop.tui.findings import findings
from ddptop.tui.rows import (
    RowBuilder,
    build_rows,
    cells,
    format_line,
    header_line,
    mem_level,
    progress_bar,
    util_level,
)
from ddptop.tui.sort_filter import filter_rows, sort_rows
from tests.probes_tui.fakes import NOW, lost, model_of, state


def test_one_row_per_rank_including_never_seen() -> None:
    model = model_of([state(0), state(1), state(3)])
    rows = build_rows(model, NOW)
    assert [r.rank for r in rows] == [0, 1, 2, 3]
    assert rows[2].status == "unknown"
    assert rows[0].status == "running" and rows[0].host == "node-a"


def test_healthy_job_has_no_marks_even_with_sampling_skew() -> None:
    # Ranks sampled at different instants differ by a few seqs: not a lag while seq moves.
    model = model_of([state(0, seq=300), state(1, seq=296), state(2, seq=305), state(3, seq=301)])
    rows = build_rows(model, NOW)
    assert all(not r.marks for r in rows)
    assert [f for f in findings(model, NOW) if f.at_least("warning")] == []


def test_stuck_rank_behind_leader_is_marked_lagging() -> None:
    model = model_of([state(0, seq=300, step=100), state(1, seq=280, step=90, stuck=True),
                      state(2, seq=300, step=100)])
    rows = {r.rank: r for r in build_rows(model, NOW)}
    assert desync.LAG_SEQ in rows[1].marks and desync.LAG_STEP in rows[1].marks
    assert rows[1].seq_lag == 20
    assert not rows[0].marks
    text = format_line(cells(rows[1]))
    assert "LAG-SEQ" in text and "280 -20" in text


def test_different_collective_at_same_seq_is_a_mismatch() -> None:
    states = [state(r, op="gloo:all_reduce", op_seq=50, stuck=True) for r in (0, 2, 3)]
    states.append(state(1, op="gloo:all_gather", op_seq=50, stuck=True))
    model = model_of(states)
    marks = desync.desync_marks(model, NOW)
    assert marks[1] == [desync.MISMATCH]
    assert all(desync.MISMATCH not in marks[r] for r in (0, 2, 3))
    kinds = {f.kind: f for f in findings(model, NOW)}
    assert kinds["collective_mismatch"].ranks == [1]
    assert kinds["collective_mismatch"].severity == "critical"


def test_unequal_batches_per_epoch_marked() -> None:
    model = model_of([state(0, bpe=60), state(1, bpe=60), state(2, bpe=57), state(3, bpe=60)])
    rows = {r.rank: r for r in build_rows(model, NOW)}
    assert rows[2].marks == [desync.BATCHES]
    assert "unequal_batches" in [f.kind for f in findings(model, NOW)]
    no_majority = model_of([state(0, bpe=41), state(1, bpe=52), state(2, bpe=61), state(3, bpe=51)])
    assert all(r.marks == [desync.BATCHES] for r in build_rows(no_majority, NOW))


def test_lost_and_stale_ranks_marked() -> None:
    model = model_of([state(0), state(1), state(2, t=NOW - 30)])
    model.ranks[2].received_at = NOW - 30
    model.apply(lost(1))
    rows = {r.rank: r for r in build_rows(model, NOW)}
    assert rows[1].status == "lost" and desync.LOST in rows[1].marks
    assert rows[2].status == "stale" and desync.STALE in rows[2].marks
    assert "⚠ LOST" in format_line(cells(rows[1]))


def test_sort_by_columns_missing_last() -> None:
    model = model_of([state(r, step=s, world=3) for r, s in ((0, 5), (1, 9), (2, 7))])
    rows = build_rows(model, NOW)
    assert [r.rank for r in sort_rows(rows, "step")] == [0, 2, 1]
    assert [r.rank for r in sort_rows(rows, "step", reverse=True)] == [1, 2, 0]
    # rank 1 never seen: sorted last whatever the order
    with_unknown = build_rows(model_of([state(0, step=5, world=3), state(2, step=1, world=3)]), NOW)
    assert [r.rank for r in sort_rows(with_unknown, "step", reverse=True)] == [0, 2, 1]


def test_filter_by_rank_range_host_status_and_mark() -> None:
    model = model_of([state(0, host="node-a"), state(1, host="node-b"), state(2, host="node-b"),
                      state(3, host="node-a")])
    model.apply(lost(3))
    rows = build_rows(model, NOW)
    assert [r.rank for r in filter_rows(rows, "2")] == [2]
    assert [r.rank for r in filter_rows(rows, "0-1")] == [0, 1]
    assert [r.rank for r in filter_rows(rows, "node-b")] == [1, 2]
    assert [r.rank for r in filter_rows(rows, "lost")] == [3]
    assert [r.rank for r in filter_rows(rows, "0, lost")] == [0, 3]
    assert [r.rank for r in filter_rows(rows, "")] == [0, 1, 2, 3]
    assert filter_rows(rows, "nothing-like-this") == []


def test_nvitop_colour_levels_and_progress_bar() -> None:
    assert [util_level(v) for v in (5, 10, 74, 75, None)] == ["ok", "warn", "warn", "bad", ""]
    assert [mem_level(v) for v in (0.05, 0.10, 0.79, 0.80)] == ["ok", "warn", "warn", "bad"]
    assert progress_bar(0, 8) == "░" * 8
    assert progress_bar(8, 8) == "█" * 8
    assert progress_bar(4, 8) == "████░░░░"
    assert progress_bar(3, None) == "░" * 8


def test_cells_show_pending_collective_and_gpu() -> None:
    model = model_of([state(0, op="gloo:all_reduce", op_seq=51, gpu_util=80, gpu_mem=0.5)])
    text = format_line(cells(build_rows(model, NOW)[0]))
    assert "all_reduce #51 12.0s ⏱18.0s" in text
    assert "80%" in text and "50%" in text
    assert header_line().split()[:4] == ["RANK", "HOST", "STATUS", "FLAGS"]


def test_every_row_field_comes_from_its_own_state_field() -> None:
    """Rows are built positionally (for speed): each field must still hold the value it
    names. Every source value here is distinct, so a swapped position shows."""
    from ddptop.model.job import JobModel
    from ddptop.protocol import CollectiveGroup, GpuInfo, PendingOp, RankState

    st = RankState(
        rank=5, local_rank=1, world_size=8, host="node-7", pid=4242, job_id="rows", time=1000.0,
        step=111, step_time_s=0.5, epoch=3, batch=17, batches_per_epoch=40, data_wait_fraction=0.25,
        loader_ready_batches=6, cpu_percent=77.0, rss_bytes=123_456_789, shm_used_bytes=1_000,
        shm_total_bytes=9_000, gpu=GpuInfo(index=0, util_percent=42.0, mem_used_bytes=3, mem_total_bytes=12),
        collectives=[CollectiveGroup(pg="0", seq=222, timeout_s=600.0,
                                     pending=[PendingOp(seq=223, op="gloo:all_gather", age_s=9.0)])])
    model = JobModel()
    model.apply(RecordEntry(time=1000.0, rank=5, message=StateMsg(state=st)))
    row = next(r for r in build_rows(model, 1000.5) if r.rank == 5)
    assert (row.rank, row.host, row.status, row.step, row.epoch, row.batch, row.batches_per_epoch) == \
        (5, "node-7", "running", 111, 3, 17, 40)
    assert row.steps_per_s == 2.0 and row.seq == 222 and row.seq_lag == 0
    assert (row.pending_op, row.pending_seq, row.pending_age_s, row.pending_left_s) == \
        ("all_gather", 223, 9.0, 591.0)
    assert (row.data_wait, row.ready, row.cpu, row.rss) == (0.25, 6, 77.0, 123_456_789)
    assert (row.gpu_util, row.gpu_mem, row.shm_used, row.shm_total) == (42.0, 0.25, 1_000, 9_000)
    assert row.marks == []


def test_row_builder_reuses_unchanged_rows_and_equals_a_fresh_build() -> None:
    """The redraw memo: only changed ranks are rebuilt, and the rows always equal build_rows."""
    model = model_of([state(r, seq=300) for r in range(4)])
    builder = RowBuilder()
    first = builder.build(model, NOW)
    # Against the states themselves, not against build_rows (the same builder, memo empty).
    assert [(r.rank, r.seq, r.status, r.marks) for r in first] == [(r, 300, "running", []) for r in range(4)]
    # Rank 1 moves on; rank 2 stops (its seq is now behind and stuck): marks of others change too.
    model.apply(RecordEntry(time=NOW + 1, rank=1, message=StateMsg(state=state(1, seq=310, t=NOW + 1))))
    model.apply(RecordEntry(time=NOW + 1, rank=2, message=StateMsg(
        state=state(2, seq=290, stuck=True, t=NOW + 1))))
    second = builder.build(model, NOW + 1)
    assert second == build_rows(model, NOW + 1)  # the memo's rows equal a fresh builder's
    assert (second[1].seq, second[2].seq) == (310, 290) and desync.LAG_SEQ in second[2].marks
    assert second[0] is first[0] and second[3] is first[3]  # untouched ranks: the same row objects
    assert second[1] is not first[1] and second[1].seq == 310
    assert desync.LAG_SEQ in second[2].marks and second[2].seq_lag == 20
    assert second[0].seq_lag == 10  # the leader moved: lag of a reused row is recomputed
    # A status change alone (connection lost), a history reply and a vanished rank.
    model.apply(lost(3, at=NOW + 2))
    model.apply(HistoryMsg(rank=0, samples=[]))
    third = builder.build(model, NOW + 2)
    assert third == build_rows(model, NOW + 2)
    assert third[3].status == "lost" and third[3] is not first[3]
    assert third[0] is not second[0]  # a history reply replaced the deque: speed may differ
    del model.ranks[2]
    assert builder.build(model, NOW + 2) == build_rows(model, NOW + 2)


def test_header_names_backend_world_hosts_and_attach_state() -> None:
    from ddptop.tui.widgets.header import header_text

    model = model_of([state(r, host=f"node-{r}", world=6) for r in range(6)])
    model.apply(lost(4))
    text = header_text(model, NOW, None).plain
    assert "job jfake · 6 ranks" in text and "· gloo · up 1m30s ·" in text
    assert "hosts node-0, node-1, node-2, node-3 +2" in text  # 512 hosts would not fit a line
    assert "1 lost (rank 4)" in text and "✓ no findings" in text
    # Statuses handed in by the caller (the row builder's) are used as they are.
    assert "connected 6/6" in header_text(model, NOW, None, statuses={r: "running" for r in range(6)}).plain
