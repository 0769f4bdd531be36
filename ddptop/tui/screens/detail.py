"""Rank detail (Enter): identity, versions, env, fingerprints, sparklines, pending ops, stack.

A rank seen through a node agent's digest lane has on-demand fields as old as its last detail:
the screen asks the source for its fresh state when it opens, every few seconds while it stays
open and on ``r`` (off the UI thread, one request in flight at a time), and says how old what
it shows is (:mod:`ddptop.tui.on_demand`).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from ddptop.frames import frame_text
from ddptop.model.rank_view import RankView
from ddptop.protocol import LoaderInfo, PendingOp
from ddptop.source import JobSource, StatesResult
from ddptop.textfmt import human_bytes, human_duration, op_tensors, percent, rank_ranges
from ddptop.tui.limits_text import limit_lines
from ddptop.tui.on_demand import FETCH_TIMEOUT_S, REFRESH_S, OnDemand, on_demand_text
from ddptop.tui.stack_groups import main_thread

log = logging.getLogger(__name__)

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


def detail_text(view: RankView, status: str, now: float, on_demand: str | None = None) -> Text:
    """Everything known about one rank, as text (pure). *on_demand*: how old its on-demand
    fields are, where they are not fresh with every state (None: no section for them)."""
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
    if st.where is not None:  # read in-process by its reporter while it made no progress
        text.append(f"where: {frame_text(st.where)} (main thread, no progress)\n", style="bold yellow")
    if on_demand is not None:
        on_demand_text(text, st, on_demand, now)
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
    limits = limit_lines(st, hist)
    if limits:
        _section(text, "limits (history against the limit)")
        text.append("\n".join(limits) + "\n")
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
    """Full-screen detail of one rank; Escape goes back. Given a live *source* whose rank's
    on-demand fields are stale (:meth:`~ddptop.source.JobSource.on_demand_stale`), it fetches
    the rank's fresh state and shows that."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "app.pop_screen", "back"),
                                             Binding("r", "fetch", "fresh state")]

    class Fetched(Message):
        """A request for the rank's fresh state came back (from the worker thread)."""

        def __init__(self, result: StatesResult) -> None:
            super().__init__()
            self.result = result

    def __init__(self, view: RankView, status: str, now: float, source: JobSource | None = None) -> None:
        super().__init__()
        self.rank, self.view, self.status = view.rank, view, status
        # Only where the state shown lacks fresh on-demand fields: elsewhere every state has them.
        self.source = source if source is not None and source.live and _stale(source, view.rank) else None
        self.on_demand = OnDemand(view.rank)
        self._text = detail_text(view, status, now, self.on_demand.line() if self.source else None)

    def compose(self) -> ComposeResult:
        """A scrollable text body and the footer."""
        with VerticalScroll(id="detail-body"):
            yield Static(self._text, id="detail-text")
        yield Footer()

    def on_mount(self) -> None:
        """Fetch the fresh state at once, then again every REFRESH_S while the screen is open."""
        if self.source is not None:
            self.action_fetch()
            self.set_interval(REFRESH_S, self.action_fetch)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The fetch key only where there is something to fetch (hidden from the footer else)."""
        return self.source is not None if action == "fetch" else True

    def action_fetch(self) -> None:
        """Ask for the rank's fresh state in a worker thread (the request blocks), unless one
        is in flight already: an open screen never has two."""
        if self.source is not None and self.on_demand.begin():
            self._render_text()
            self.run_worker(self._fetch, thread=True, group="detail-state", exit_on_error=False)

    def _fetch(self) -> None:
        assert self.source is not None
        try:
            result = self.source.request_states([self.rank], timeout=FETCH_TIMEOUT_S)
        except Exception as exc:  # said on the screen ("not available: why"), never a crash
            log.warning("state request of rank %d failed: %s", self.rank, exc)
            result = StatesResult({}, {}, {self.rank: str(exc) or type(exc).__name__})
        self.post_message(self.Fetched(result))  # thread-safe

    def on_rank_detail_fetched(self, message: Fetched) -> None:
        """Show the fresh state (or why there is none) with how old it is."""
        self.on_demand.settle(message.result)
        self._render_text()

    def _render_text(self) -> None:
        view, fresh = self.view, self.on_demand.state
        if fresh is not None:  # the rank's whole newest state: shown in place of the model's copy
            view = copy.copy(view)  # shallow: the model's view (and its history) stay as they are
            view.state, view.received_at = fresh, self.on_demand.taken_at
        self._text = detail_text(view, self.status, time.time(), self.on_demand.line())
        self.query_one("#detail-text", Static).update(self._text)


def _stale(source: JobSource, rank: int) -> bool:
    # A source written before on-demand fetching (a test's double) has no such question: its
    # states are taken as whole.
    stale = getattr(source, "on_demand_stale", None)
    return bool(stale(rank)) if callable(stale) else False


def _tensors(op: PendingOp) -> str:
    """An op's tensors as a person reads them: '[4, 6922] float32' (textfmt, one place)."""
    return op_tensors(op.sizes, op.dtype)
