"""Rank detail (Enter): identity, versions, env, fingerprints, sparklines, pending ops, stack."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from ddptop.model.job import RankView
from ddptop.protocol import LoaderInfo, PendingOp
from ddptop.textfmt import human_bytes, human_duration, op_tensors, percent, rank_ranges
from ddptop.tui.stack_groups import main_thread

_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60
RECENT_SHOWN = 4  # completed ops shown per group before the pending ones


def sparkline(values: Sequence[float | None], width: int = SPARK_WIDTH) -> str:
    """Text sparkline of the last *width* values ('·' where a value is missing)."""
    vals = list(values)[-width:]
    known = [v for v in vals if v is not None]
    if not known:
        return "(no data)"
    lo, hi = min(known), max(known)
    span = hi - lo or 1.0
    return "".join("·" if v is None else _BLOCKS[int((v - lo) / span * (len(_BLOCKS) - 1))] for v in vals)


def _section(text: Text, title: str) -> None:
    text.append(f"\n{title}\n", style="bold underline")


def detail_text(view: RankView, status: str, now: float) -> Text:
    """Everything known about one rank, as text (pure)."""
    text = Text()
    st = view.state
    text.append(f"rank {view.rank}", style="bold")
    text.append(f"  status {status}  connection {view.connection}"
                f"{' (' + view.connection_reason + ')' if view.connection_reason else ''}\n")
    if st is None:
        text.append("no state received from this rank yet\n")
        return text
    text.append(f"host {st.host}  pid {st.pid}  local rank {st.local_rank}/{st.world_size}  "
                f"restarts {st.restart_count}  "
                f"last state {human_duration(max(0.0, now - view.received_at))} ago\n")
    if st.exit_reason:
        text.append(f"exit reason: {st.exit_reason}\n", style="bold red")
    _section(text, "versions")
    v = st.versions
    text.append(f"python {v.python}  torch {v.torch or '-'}  cuda {v.cuda or '-'}  nccl {v.nccl or '-'}  "
                f"driver {v.driver or '-'}  ddptop {v.ddptop}\n")
    if st.gpu is not None:
        g = st.gpu
        text.append(f"gpu {g.index} {g.name} cc {g.compute_capability or '-'}  util "
                    f"{'-' if g.util_percent is None else f'{g.util_percent:.0f}%'}  mem "
                    f"{human_bytes(g.mem_used_bytes)}/{human_bytes(g.mem_total_bytes)}\n")
    _section(text, "fingerprints")
    pf, rf = st.param_fingerprint, st.rng_fingerprint
    text.append("params: " + (f"{pf.count} tensors, {pf.numel} elements, shapes {pf.shapes_hash} "
                              f"({pf.wrapper})" if pf else "-") + "\n")
    text.append("rng: " + (f"epoch {rf.epoch} torch {rf.torch} numpy {rf.numpy} python {rf.python}"
                           if rf else "-") + "\n")
    _section(text, "progress")
    text.append(f"step {st.step}  epoch {st.epoch}  batch {st.batch}/{st.batches_per_epoch or '?'}  "
                f"data wait {percent(st.data_wait_fraction)}  loader workers {st.loader_workers}  "
                f"cpu {'-' if st.cpu_percent is None else f'{st.cpu_percent:.0f}%'}  "
                f"rss {human_bytes(st.rss_bytes)}\n")
    hist = list(view.history)
    text.append(f"step time  {sparkline([s.step_time_s for s in hist])}  "
                f"(now {human_duration(st.step_time_s)})\n")
    text.append(f"data wait  {sparkline([s.data_wait_fraction for s in hist])}  "
                f"(now {percent(st.data_wait_fraction)})\n")
    _loaders(text, st.loaders)
    _section(text, "collectives")
    for group in st.collectives:
        members = f", ranks {rank_ranges(group.ranks)}" if group.ranks else ""
        text.append(f"group {group.pg} {group.desc} {group.backend}: seq {group.seq}, size {group.size}"
                    f"{members}, timeout {human_duration(group.timeout_s)}\n")
        # The last ops that completed (from a Flight Recorder dump or last words): what led here.
        done = [op for op in group.recent if op.state == "completed"][-RECENT_SHOWN:]
        for op in done:
            number = op.p2p_seq if op.is_p2p else op.seq
            text.append(f"  done    {op.op} #{number} {_tensors(op)}\n", style="dim")
        for op in group.pending:
            text.append(f"  pending {op.op} #{op.p2p_seq if op.is_p2p else op.seq} {_tensors(op)} for "
                        f"{human_duration(op.age_s)} {op.state}\n", style="yellow")
    if not st.collectives:
        text.append("-\n")
    _section(text, "environment")
    for key, value in sorted(st.env.items()):
        text.append(f"{key}={value}\n")
    _section(text, "last stack")
    thread = main_thread(view.stacks) if view.stacks else None
    if thread is None or view.stacks is None:
        text.append("none yet (press s on the dashboard to fetch stacks)\n")
    else:
        text.append(f"thread {thread.name}, taken {human_duration(max(0.0, now - view.stacks.time))} ago\n")
        for frame in reversed(thread.frames):
            text.append(f"  {frame.function}  {frame.file}:{frame.line}\n")
    return text


def _loaders(text: Text, loaders: Sequence[LoaderInfo]) -> None:
    """One line per DataLoader: role, length, where its pass is, workers."""
    _section(text, "loaders")
    if not loaders:
        text.append("-\n")
        return
    for info in loaders:
        role = info.role or "?"
        length = "?" if info.length is None else info.length
        line = (f"#{info.index} {role:<5} {info.name}  batch {info.batch}/{length}"
                f"  pass {info.passes} ({info.passes_completed} done)  steps {info.steps}"
                f"  batch size {info.batch_size if info.batch_size is not None else '-'}"
                f"  workers {info.workers}"
                + (f" pids {' '.join(str(p) for p in info.worker_pids)}" if info.worker_pids else "")
                + (f"  ready {info.ready_batches}" if info.ready_batches else "") + "\n")
        text.append(line, style="bold" if info.role == "train" else "")


class RankDetail(Screen[None]):
    """Full-screen detail of one rank; Escape goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "app.pop_screen", "back")]

    def __init__(self, view: RankView, status: str, now: float) -> None:
        super().__init__()
        self._text = detail_text(view, status, now)
        self.rank = view.rank

    def compose(self) -> ComposeResult:
        """A scrollable text body and the footer."""
        with VerticalScroll(id="detail-body"):
            yield Static(self._text, id="detail-text")
        yield Footer()


def _tensors(op: PendingOp) -> str:
    """An op's tensors as a person reads them: '[4, 6922] float32' (textfmt, one place)."""
    return op_tensors(op.sizes, op.dtype)
