"""Rank-table rows: built from a JobModel and formatted into cells (pure).

The rank table widget only paints what these helpers produce, so every decision about
what a row says (and which style class colours it) is testable without a terminal. Their
order and the filter over them are :mod:`ddptop.tui.sort_filter`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.diagnosis.desync import RankFacts, facts_of, leads_of, marks_of
from ddptop.model.job import JobModel
from ddptop.model.rank_view import RankView
from ddptop.protocol import RankState, Sample
from ddptop.status import Status
from ddptop.textfmt import human_bytes, human_duration, pending_text, rank_ranges, usage_text
from ddptop.textfmt import number as _num

BAR_CELLS = 8


@dataclass(frozen=True)
class Column:
    """One rank-table column: key, title, width in cells, right-aligned or not."""

    key: str
    title: str
    width: int
    right: bool = True


COLUMNS: tuple[Column, ...] = (
    Column("rank", "RANK", 5), Column("host", "HOST", 10, False), Column("status", "STATUS", 8, False),
    Column("flags", "FLAGS", 20, False), Column("step", "STEP", 13), Column("epoch", "EP", 3),
    Column("batch", "BATCH", 16, False), Column("seq", "SEQ(LAG)", 11),
    Column("pending", "PENDING COLLECTIVE", 28, False), Column("wait", "WAIT", 4),
    Column("ready", "RDY", 3), Column("cpu", "CPU", 4), Column("rss", "RSS", 6),
    Column("gpu", "GPU", 4), Column("gmem", "GMEM", 4), Column("shm", "SHM", 12),
)
COLUMN_KEYS: tuple[str, ...] = tuple(c.key for c in COLUMNS)


@dataclass(slots=True)
class RankRow:
    """Everything one table row shows, as values (formatting happens in :func:`cells`)."""

    rank: int
    host: str = ""
    status: str = "starting"
    marks: list[str] = field(default_factory=list)
    step: int | None = None
    steps_per_s: float | None = None
    epoch: int | None = None
    batch: int | None = None
    batches_per_epoch: int | None = None
    seq: int | None = None
    seq_lag: int = 0
    pending_op: str = ""
    pending_seq: int | None = None
    pending_age_s: float | None = None
    pending_left_s: float | None = None
    data_wait: float | None = None
    ready: int | None = None
    cpu: float | None = None
    rss: int | None = None
    gpu_util: float | None = None
    gpu_mem: float | None = None  # fraction used
    shm_used: int | None = None
    shm_total: int | None = None

    @property
    def desynced(self) -> bool:
        """True when the row carries any desync mark."""
        return bool(self.marks)


@dataclass(slots=True, eq=False)
class GroupRow:
    """One table line standing for many ranks (jobs above ``GROUP_FROM_RANKS`` ranks): the
    ranks of one node, one status or one collective, read as a sentence, expandable in place.

    The ranges are filled by :mod:`ddptop.tui.row_index` only for group rows on screen.
    """

    kind: str  # "node" | "status" | "collective" | "rest" (the odd view's healthy majority)
    key: tuple[str, ...]
    ranks: set[int]
    expanded: bool = False
    status_counts: dict[str, int] = field(default_factory=dict)
    step_lo: int | None = None
    step_hi: int | None = None
    seq_lo: int | None = None
    seq_hi: int | None = None
    pending: str = ""  # 'all_reduce #3702' when the ranks wait in one collective
    oldest_wait_s: float | None = None
    marks: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        """How many ranks the row stands for."""
        return len(self.ranks)


def group_line(group: GroupRow, width: int) -> str:
    """'▸ 32,761 ranks  running  all_reduce #3702 waiting 12s  step 9-10  seq 3701-3702'."""
    words = [("▾" if group.expanded else "▸") + f" {group.count:,} rank{'s' if group.count != 1 else ''}"]
    if group.kind == "node":
        words.append(f"on {group.key[0] or '?'}")
    words.append(", ".join(f"{n:,} {w}" for w, n in sorted(group.status_counts.items(), key=lambda i: -i[1]))
                 if len(group.status_counts) > 1 else next(iter(group.status_counts), ""))
    if group.pending:
        wait = "" if group.oldest_wait_s is None else f" waiting {human_duration(group.oldest_wait_s)}"
        words.append(group.pending + wait)
    elif group.kind in ("collective", "rest") and group.key[-1] == "computing":
        words.append("computing")
    if group.step_lo is not None:
        words.append(f"step {_span(group.step_lo, group.step_hi)}")
    if group.seq_lo is not None:
        words.append(f"seq {_span(group.seq_lo, group.seq_hi)}")
    if group.marks:
        words.append("⚠ " + " ".join(group.marks))
    if group.kind != "rest" and group.count <= 64:
        words.append(f"ranks {rank_ranges(sorted(group.ranks))}")
    return ("  ".join(w for w in words if w))[:width].ljust(width)


def _span(lo: int | None, hi: int | None) -> str:
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def steps_per_second(view: RankView) -> float | None:
    """Recent training speed from the history (last ~10 s), else 1 / step time."""
    hist = view.history
    n = len(hist)  # two indexings from the end: copying a 3600-sample deque per rank is too slow
    if n >= 2:
        first, last = hist[max(0, n - 11)], hist[n - 1]
        if last.time > first.time:
            return max(0.0, (last.step - first.step) / (last.time - first.time))
    st = view.state
    if st is not None and st.step_time_s:
        return 1.0 / st.step_time_s
    return None


def build_rows(model: JobModel, now: float) -> list[RankRow]:
    """One row per known rank (and per never-seen rank of the world), by rank."""
    return RowBuilder().build(model, now)


class RowBuilder:
    """:func:`build_rows` with a memo: a rank's row is rebuilt only when it changed.

    At 4096 ranks rebuilding every row costs tens of milliseconds, while between two
    redraws only the ranks that sent a sample (or changed status) differ. A row is kept
    while its rank's version (events folded into it), state object and status word are the
    same; the marks and seq lag, which depend on every rank, are recomputed each time from
    cached facts.
    The result equals ``build_rows`` on the same model (a test holds it to that).
    """

    def __init__(self) -> None:
        self._memo: dict[int, tuple[int, object, str, RankRow, RankFacts]] = {}
        self.statuses: dict[int, str] = {}  # of the latest build, by rank (the header reuses them)

    def build(self, model: JobModel, now: float) -> list[RankRow]:
        """The rows of *model* at *now* (rows of unchanged ranks are reused and updated)."""
        memo, fresh = self._memo, {}
        rows: list[RankRow] = []
        facts: list[RankFacts] = []
        statuses = model.statuses(now)  # with job context: victims of a teardown are torn_down
        for rank, view in sorted(model.ranks.items()):
            status = statuses[rank]
            hit = memo.get(rank)
            # The state's identity too: a replayed model is a fresh copy at every seek.
            if hit is not None and hit[0] == view.version and hit[1] is view.state and hit[2] == status:
                entry = hit
            else:
                f = facts_of(view.state, status)
                entry = (view.version, view.state, status, _row(view, status, f), f)
            fresh[rank] = entry
            rows.append(entry[3])
            facts.append(entry[4])
        self._memo = fresh  # ranks gone from the model leave the memo too
        self.statuses = statuses
        leads = leads_of(facts)
        for row, f in zip(rows, facts, strict=True):
            row.marks = marks_of(f, leads)
        seen = model.ranks
        unknown = [RankRow(rank=r, status=Status.UNKNOWN) for r in range(model.world_size) if r not in seen]
        leader = max((r.seq for r in rows if r.seq is not None), default=None)
        for row in rows:
            row.seq_lag = leader - row.seq if leader is not None and row.seq is not None else 0
        # The rows are in rank order already (sorted above); ranks never heard from interleave.
        return sorted(rows + unknown, key=lambda r: r.rank) if unknown else rows


def _row(view: RankView, status: str, facts: RankFacts) -> RankRow:
    # The columns are pulse fields (ddptop.digest) or detail: a pulse not merged yet (the
    # digest lane) is read as is, with its detail, so a sort of 32,768 rows merges none.
    st, pulse = view.base, view.pulse
    if st is None:
        return RankRow(rank=view.rank, status=status)
    op = facts.op  # seq and op come from the facts the marks use: computed once
    if op is None:
        pending_op, pending_seq, pending_age, pending_left = "", None, None, None
    else:
        pending_op, pending_seq, pending_age, pending_left = _short_op(op.op), op.seq, op.age_s, None
        timeout = op.timeout_s or next((g.timeout_s for g in st.collectives if g.timeout_s), None)
        if timeout is not None:
            pending_left = timeout - op.age_s
    gpu, gpu_util, gpu_mem, used = st.gpu, None, None, None
    if pulse is None:
        s: RankState | Sample = st
        shm_used = st.shm_used_bytes
        if gpu is not None:
            gpu_util, used = gpu.util_percent, gpu.mem_used_bytes
    else:
        s, shm_used = pulse.sample, pulse.shm_used_bytes
        if gpu is not None:
            gpu_util, used = pulse.sample.gpu_util_percent, pulse.gpu_mem_used_bytes
    if gpu is not None and used is not None and gpu.mem_total_bytes:
        gpu_mem = used / gpu.mem_total_bytes
    # Positional, in RankRow's field order: a thousand rows change per redraw at 4096 ranks
    # and matching 22 keywords cost a third of building a row. tests/test_tui_rows.py checks
    # every field against the state it comes from.
    return RankRow(view.rank, st.host, status, [], s.step, steps_per_second(view), s.epoch, s.batch,
                   st.batches_per_epoch, facts.seq, 0, pending_op, pending_seq, pending_age, pending_left,
                   s.data_wait_fraction, s.loader_ready_batches, s.cpu_percent, s.rss_bytes, gpu_util,
                   gpu_mem, shm_used, st.shm_total_bytes)


def _short_op(op: str) -> str:
    # "gloo:all_reduce" -> "all_reduce": the backend is in the header already.
    return op.split(":", 1)[-1]


# ---------------------------------------------------------------- cells

def progress_bar(done: int, total: int | None, cells: int = BAR_CELLS) -> str:
    """A text bar ('████▌░░░'), readable without colour."""
    if not total or total <= 0:
        return "░" * cells
    eighths = round(min(1.0, max(0.0, done / total)) * cells * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")
    return (bar + "░" * cells)[:cells]


def util_level(percent: float | None) -> str:
    """nvitop's GPU utilisation colours: ok below 10 %, warn below 75 %, bad above."""
    if percent is None:
        return ""
    return "ok" if percent < 10 else "warn" if percent < 75 else "bad"


def mem_level(fraction: float | None) -> str:
    """nvitop's GPU memory colours: ok below 10 %, warn below 80 %, bad above."""
    if fraction is None:
        return ""
    return "ok" if fraction < 0.10 else "warn" if fraction < 0.80 else "bad"


def status_level(row: RankRow) -> str:
    """Style level of the status cell (paired with the status word itself)."""
    if row.status in (Status.LOST, Status.CRASHED, Status.TERMINATED):
        return "bad"
    if row.status in (Status.STALE, Status.TORN_DOWN, Status.UNKNOWN, Status.STARTING):
        return "warn"
    return "ok" if row.status == Status.RUNNING else ""


def cells(row: RankRow) -> list[tuple[str, str]]:
    """(text, level) per column of :data:`COLUMNS`; level is '', 'ok', 'warn' or 'bad'."""
    flag_text = ("⚠ " + " ".join(row.marks)) if row.marks else "✓"
    step = "-" if row.step is None else f"{row.step} {_num(row.steps_per_s, '{:.1f}')}/s"
    batch = "-" if row.batch is None else (
        f"{row.batch}/{_num(row.batches_per_epoch)} {progress_bar(row.batch, row.batches_per_epoch)}")
    # Sampling skew makes moving ranks differ by a few seqs; the lag is shown once it is real.
    seq = "-" if row.seq is None else (f"{row.seq} -{row.seq_lag}" if row.seq_lag and is_lagging(row)
                                       else f"{row.seq}")
    pending = ""
    if row.pending_seq is not None:
        left = "" if row.pending_left_s is None else f" ⏱{human_duration(max(0.0, row.pending_left_s))}"
        pending = pending_text(row.pending_op, row.pending_seq, row.pending_age_s) + left
    shm = usage_text(row.shm_used, row.shm_total)
    pending_level = "bad" if row.pending_left_s is not None and row.pending_left_s < 60 else (
        "warn" if row.pending_seq is not None and (row.pending_age_s or 0) >= 5 else "")
    return [
        (str(row.rank), ""), (row.host or "-", ""), (row.status, status_level(row)),
        (flag_text, "bad" if row.marks else "ok"), (step, ""), (_num(row.epoch), ""), (batch, ""),
        (seq, "warn" if is_lagging(row) else ""), (pending, pending_level),
        (_num(None if row.data_wait is None else row.data_wait * 100, "{:.0f}%"),
         "warn" if (row.data_wait or 0) >= 0.3 else ""),
        (_num(row.ready), ""), (_num(row.cpu, "{:.0f}%"), ""), (human_bytes(row.rss), ""),
        (_num(row.gpu_util, "{:.0f}%"), util_level(row.gpu_util)),
        (_num(None if row.gpu_mem is None else row.gpu_mem * 100, "{:.0f}%"), mem_level(row.gpu_mem)),
        (shm, "warn" if row.shm_used and row.shm_total and row.shm_used / row.shm_total > 0.8 else ""),
    ]


def is_lagging(row: RankRow) -> bool:
    """True when the row is marked as lagging in seq or step."""
    return any(m.startswith("LAG") for m in row.marks)


def format_line(parts: list[tuple[str, str]]) -> str:
    """Cells padded/cropped to their column widths and joined (plain text of a row)."""
    out = []
    for (text, _), col in zip(parts, COLUMNS, strict=True):
        text = text if len(text) <= col.width else text[: col.width - 1] + "…"
        out.append(text.rjust(col.width) if col.right else text.ljust(col.width))
    return " ".join(out)


def header_line() -> str:
    """Column titles, aligned like :func:`format_line`."""
    return format_line([(c.title, "") for c in COLUMNS])


def summary(rows: list[RankRow]) -> str:
    """'4 ranks: 3 running, 1 lost (rank 2)' style one-liner."""
    by_status: dict[str, list[int]] = {}
    for r in rows:
        by_status.setdefault(r.status, []).append(r.rank)
    parts = [f"{len(v)} {k}" + (f" ({rank_ranges(v)})" if k != "running" else "")
             for k, v in sorted(by_status.items())]
    return f"{len(rows)} ranks: " + ", ".join(parts)
