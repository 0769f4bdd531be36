"""Fake sources and states for the dashboard tests (no sockets, frozen clock)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ddptop.model.job import JobModel
from ddptop.protocol import (
    CollectiveGroup,
    ConnectionEvent,
    Event,
    FrameStack,
    FrTraceMsg,
    GpuInfo,
    PendingOp,
    RankState,
    RecordEntry,
    StacksMsg,
    StateMsg,
    ThreadStack,
)
from ddptop.source import Emit, Foreground, PulseSink, StacksResult, StatesResult

NOW = 1_700_000_000.0


def state(rank: int, *, step: int = 100, seq: int = 300, bpe: int | None = 64, op: str | None = None,
          op_seq: int | None = None, stuck: bool = False, host: str = "node-a", world: int = 4,
          gpu_util: float | None = None, gpu_mem: float | None = None, t: float = NOW) -> RankState:
    """A running rank's state; *stuck* makes seq and step stop moving 10 s ago."""
    moved = t - 10.0 if stuck else t
    pending = [PendingOp(seq=op_seq or seq + 1, op=op, age_s=12.0, timeout_s=30.0)] if op else []
    gpu = None
    if gpu_util is not None or gpu_mem is not None:
        gpu = GpuInfo(index=rank, util_percent=gpu_util,
                      mem_used_bytes=None if gpu_mem is None else int(gpu_mem * 80e9),
                      mem_total_bytes=int(80e9))
    return RankState(rank=rank, local_rank=rank, world_size=world, host=host, pid=1000 + rank,
                     job_id="jfake", time=t, start_time=t - 90, step=step, last_step_at=moved,
                     step_time_s=0.05, epoch=1, batch=step % 64, batches_per_epoch=bpe,
                     backend="gloo", data_wait_fraction=0.05, loader_ready_batches=2,
                     collectives=[CollectiveGroup(pg="0", seq=seq, seq_changed_at=moved, pending=pending)],
                     cpu_percent=95.0, rss_bytes=300 << 20, gpu=gpu,
                     shm_used_bytes=1 << 20, shm_total_bytes=64 << 20)


def model_of(states: Sequence[RankState], at: float = NOW) -> JobModel:
    """A model that received *states* at *at*."""
    model = JobModel()
    for st in states:
        model.apply(RecordEntry(time=at, rank=st.rank, message=StateMsg(state=st)))
    return model


def stack(rank: int, funcs: Sequence[str], t: float = NOW) -> StacksMsg:
    """A stack whose main thread calls *funcs* outermost first, in train.py."""
    frames = [FrameStack(file="/work/train.py", line=10 + i, function=f) for i, f in enumerate(funcs)]
    return StacksMsg(rank=rank, time=t, threads=[
        ThreadStack(thread_id=2, name="ddptop-reporter", frames=frames[:1]),
        ThreadStack(thread_id=1, name="MainThread", frames=frames, is_main=True)])


class FakeSource:
    """A JobSource that emits a fixed list of events from a thread, and canned stacks."""

    live = True
    description = "fake job"

    def __init__(self, events: Sequence[Event], stacks: dict[int, StacksMsg] | None = None) -> None:
        self.events = list(events)
        self.foreground = Foreground()
        self.stacks = stacks or {}
        self.stopped = False
        self.emit: Emit | None = None
        self.stack_requests: list[list[int] | None] = []

    def start(self, emit: Emit, pulses: PulseSink | None = None) -> None:
        """Emit every event from a background thread (as LiveSource does)."""
        self.emit = emit
        threading.Thread(target=lambda: [emit(e) for e in self.events], daemon=True).start()

    def stop(self) -> None:
        """Remember that the app stopped us."""
        self.stopped = True

    def request_stacks(self, ranks: Sequence[int] | None = None, timeout: float = 5.0) -> StacksResult:
        """Canned stacks; ranks without one are errors."""
        self.stack_requests.append(None if ranks is None else list(ranks))
        wanted = list(ranks) if ranks is not None else sorted(self.stacks)
        return StacksResult({r: self.stacks[r] for r in wanted if r in self.stacks},
                            {r: "not connected" for r in wanted if r not in self.stacks})

    def request_states(self, ranks: Sequence[int], timeout: float = 5.0) -> StatesResult:
        """None available: a fake job has nothing fresher than what it emitted."""
        return StatesResult({}, {}, dict.fromkeys(ranks, "not available here"))

    def on_demand_stale(self, rank: int) -> bool:
        """Every state it emits is whole: nothing to fetch."""
        return False

    def request_fr_traces(self, ranks: Sequence[int] | None = None,
                          timeout: float = 5.0) -> dict[int, FrTraceMsg]:
        """None available."""
        return {}


def entries(states: Sequence[RankState], at: float = NOW) -> list[Event]:
    """RecordEntry events for *states*."""
    return [RecordEntry(time=at, rank=s.rank, message=StateMsg(state=s)) for s in states]


def lost(rank: int, at: float = NOW) -> ConnectionEvent:
    """A connection-lost event."""
    return ConnectionEvent(time=at, rank=rank, status="lost", reason="connection closed by the rank")
