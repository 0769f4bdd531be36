"""The viewer's model of a job: pure state, updated by events, read with a clock.

Live attach, ``doctor --watch``, the recorder and replay all feed the same events
(:class:`~ddptop.protocol.StateMsg`, ``HistoryMsg``, ``StacksMsg``, ``ConnectionEvent``...)
into a :class:`JobModel`; the dashboard and the diagnosis read it. No sockets, threads or
terminal here: every time is passed in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ddptop.model.snapshot import JobSnapshot, build_snapshot
from ddptop.protocol import (
    ConnectionEvent,
    FrTraceMsg,
    HistoryMsg,
    Message,
    RankState,
    RecordEntry,
    Sample,
    StacksMsg,
    StateMsg,
)

HISTORY_LEN = 3600  # samples kept per rank by the viewer (1 h at 1 Hz)
STALE_AFTER_S = 5.0  # no state for this long: the rank is "stale"

# Connection status words, shown in the UI next to colour.
CONNECTED, STALE, LOST = "connected", "stale", "lost"


@dataclass
class RankView:
    """Everything the viewer knows about one rank."""

    rank: int
    state: RankState | None = None
    received_at: float = 0.0
    connection: str = CONNECTED
    connection_reason: str = ""
    history: deque[Sample] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    stacks: StacksMsg | None = None
    fr_trace: FrTraceMsg | None = None

    def status(self, now: float, stale_after_s: float = STALE_AFTER_S) -> str:
        """The rank's status word at *now*: lost / crashed / exited / stale / the rank's own."""
        if self.state is not None and self.state.status in ("crashed", "exited"):
            return self.state.status
        if self.connection == LOST:
            return LOST
        if self.state is None:
            return "starting" if self.connection == CONNECTED else self.connection
        if self.connection == STALE or now - self.received_at > stale_after_s:
            return STALE
        return self.state.status


@dataclass
class JobModel:
    """All ranks of one job, as events described them."""

    job_id: str = ""
    world_size: int = 0
    ranks: dict[int, RankView] = field(default_factory=dict)
    first_time: float = 0.0
    last_time: float = 0.0

    def view(self, rank: int) -> RankView:
        """The view of *rank*, created on first use."""
        found = self.ranks.get(rank)
        if found is None:
            found = self.ranks[rank] = RankView(rank=rank)
        return found

    def apply(self, message: Message, rank: int | None = None, at: float | None = None) -> None:
        """Fold one event into the model (RecordEntry unwraps to its message)."""
        if isinstance(message, RecordEntry):
            self.apply(message.message, message.rank, message.time)
            return
        if isinstance(message, ConnectionEvent):
            view = self.view(message.rank)
            view.connection, view.connection_reason = message.status, message.reason
            self._touch(message.time)
            return
        if isinstance(message, StateMsg):
            st = message.state
            view = self.view(st.rank)
            t = at if at is not None else st.time
            view.state, view.received_at = st, t
            if view.connection != LOST or st.status in ("crashed", "exited"):
                view.connection = view.connection if st.status in ("crashed", "exited") else CONNECTED
            self.job_id = self.job_id or st.job_id
            self.world_size = max(self.world_size, st.world_size)
            _append_sample(view.history, st)
            self._touch(t)
        elif isinstance(message, HistoryMsg):
            view = self.view(message.rank)
            merged = {s.time: s for s in view.history}
            merged.update({s.time: s for s in message.samples})
            view.history = deque(sorted(merged.values(), key=lambda s: s.time), maxlen=HISTORY_LEN)
        elif isinstance(message, StacksMsg):
            self.view(message.rank).stacks = message
            self._touch(at if at is not None else message.time)
        elif isinstance(message, FrTraceMsg):
            self.view(message.rank).fr_trace = message

    def _touch(self, t: float) -> None:
        if not self.first_time or t < self.first_time:
            self.first_time = t
        self.last_time = max(self.last_time, t)

    def statuses(self, now: float) -> dict[int, str]:
        """Status word of every rank at *now*."""
        return {r: v.status(now) for r, v in sorted(self.ranks.items())}

    def snapshot(self, now: float) -> JobSnapshot:
        """The model as a JobSnapshot (status words resolved at *now*)."""
        states: list[RankState] = []
        unreachable: dict[int, str] = {}
        for rank, view in sorted(self.ranks.items()):
            if view.state is None:
                unreachable[rank] = view.connection_reason or "no state received"
                continue
            status = view.status(now)
            state = view.state if status == view.state.status else _with_status(view.state, status)
            states.append(state)
        for rank in range(self.world_size):
            if rank not in self.ranks:
                unreachable[rank] = "never seen"
        return build_snapshot(self.job_id, self.world_size, states, unreachable, now)

    def histories(self) -> dict[int, list[Sample]]:
        """Every rank's samples, oldest first."""
        return {r: list(v.history) for r, v in sorted(self.ranks.items())}


def _with_status(state: RankState, status: str) -> RankState:
    import msgspec

    return msgspec.structs.replace(state, status=status)


def _append_sample(history: deque[Sample], st: RankState) -> None:
    if history and history[-1].time >= st.time:
        return
    history.append(Sample(
        time=st.time, step=st.step, epoch=st.epoch, batch=st.batch,
        seq=st.collectives[0].seq if st.collectives else 0, step_time_s=st.step_time_s,
        data_wait_fraction=st.data_wait_fraction, loader_ready_batches=st.loader_ready_batches,
        cpu_percent=st.cpu_percent, rss_bytes=st.rss_bytes,
        gpu_util_percent=st.gpu.util_percent if st.gpu else None,
    ))
