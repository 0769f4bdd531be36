"""The viewer's model of a job: pure state, updated by events, read with a clock.

Live attach, ``doctor --watch``, the recorder and replay all feed the same events
(:class:`~ddptop.protocol.StateMsg`, ``HistoryMsg``, ``StacksMsg``, ``ConnectionEvent``...)
into a :class:`JobModel`; the dashboard and the diagnosis read it. No sockets, threads or
terminal here: every time is passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from ddptop.digest import PulseBatch
from ddptop.model.history import HISTORY_LEN, append_sample, history_len, merged_history, resized, ring
from ddptop.model.outcome import Ending, exit_fields, first_failure, resolved_status
from ddptop.model.pace import EVERY, give_way
from ddptop.model.rank_view import CONNECTED, LOST, UNREACHABLE, RankView
from ddptop.model.snapshot import JobSnapshot, build_snapshot
from ddptop.model.status_index import StatusIndex
from ddptop.protocol import (
    STUB_LOCAL_RANK,
    ConnectionEvent,
    FrTraceMsg,
    HistoryMsg,
    Message,
    RankExit,
    RankState,
    RecordEntry,
    Sample,
    StacksMsg,
    StateMsg,
)
from ddptop.status import FINAL, Status


@dataclass
class JobModel:
    """All ranks of one job, as events described them."""

    job_id: str = ""
    world_size: int = 0
    ranks: dict[int, RankView] = field(default_factory=dict)
    first_time: float = 0.0
    last_time: float = 0.0
    # rank -> (host name, address), as the job's store published them (the node agent records
    # them): where a victim's lost connection led
    places: dict[int, tuple[str, str]] = field(default_factory=dict)
    # Sets owned by consumers (the status index, the table's row index): apply adds every rank
    # whose view changed, and each consumer empties its own set when it has caught up, so a
    # redraw at 32,768 ranks visits the few hundred that changed, not every rank.
    dirty_sinks: list[set[int]] = field(default_factory=list, init=False, compare=False, repr=False)
    detail_sinks: list[set[int]] = field(default_factory=list, init=False, compare=False, repr=False)
    _status_index: StatusIndex | None = field(default=None, init=False, compare=False, repr=False)

    def watch_dirty(self, detail_only: bool = False) -> set[int]:
        """A new set that every later change of a rank's view adds the rank to.

        *detail_only*: all but a pulse over the very detail object the view holds (the digest
        lane's usual change, 32,768 a second at 32,768 ranks): for a reader of detail fields
        only (the header's identity), which such a pulse cannot change. A view whose detail
        was replaced by a merge (``RankView.state``) is added at its next pulse: more, never less.
        """
        sink: set[int] = set()
        (self.detail_sinks if detail_only else self.dirty_sinks).append(sink)
        return sink

    def _changed(self, view: RankView) -> None:
        view.version += 1
        for sink in self.dirty_sinks:
            sink.add(view.rank)
        for sink in self.detail_sinks:
            sink.add(view.rank)

    def view(self, rank: int) -> RankView:
        """The view of *rank*, created on first use."""
        found = self.ranks.get(rank)
        if found is None:
            found = self.ranks[rank] = RankView(rank=rank, history=ring(keep=history_len(self.world_size)))
        return found

    def _grow(self, world_size: int) -> None:
        # A bigger job than known (its first state, mostly): the ranks share the history budget.
        self.world_size = world_size
        keep = history_len(world_size)
        for view in self.ranks.values():
            view.history = resized(view.history, keep)

    def apply(self, message: Message | PulseBatch, rank: int | None = None, at: float | None = None) -> None:
        """Fold one event into the model (RecordEntry unwraps to its message)."""
        if isinstance(message, PulseBatch):
            self._apply_pulses(message)
            return
        if isinstance(message, RecordEntry):
            self.apply(message.message, message.rank, message.time)
            return
        if isinstance(message, ConnectionEvent):
            view = self.view(message.rank)
            self._changed(view)
            if message.status == UNREACHABLE:
                if view.connection == LOST and view.base is not None:
                    return  # heard, closed, then not reached again: the loss says more
                if view.connection != UNREACHABLE or (message.since and not view.unreachable_since):
                    # the first verdict, or a node agent's that heard the host after this viewer
                    # began (this viewer never did): since when, and whose word it is
                    view.unreachable_since, view.unreachable_seen_by = message.since, message.seen_by
            view.connection, view.connection_reason = message.status, message.reason
            if message.status == LOST and view.lost_at is None:
                view.lost_at = message.time
            self._touch(message.time)
            return
        if isinstance(message, RankExit):
            view = self.view(message.rank)
            self._changed(view)
            view.exit = message
            self._touch(message.time)
            return
        if isinstance(message, StateMsg):
            st = message.state
            view = self.view(st.rank)
            if view.state is not None and is_stub(st) and st.pid == view.state.pid:
                st = ended_over(view.state, st)
            self._changed(view)
            t = at if at is not None else st.time
            view.state, view.received_at = st, t
            if view.connection != LOST and st.status not in FINAL:
                view.connection = CONNECTED
            self.job_id = self.job_id or st.job_id
            if st.world_size > self.world_size:
                self._grow(st.world_size)
            append_sample(view.history, st)
            self._touch(t)
        elif isinstance(message, HistoryMsg):
            view = self.view(message.rank)
            self._changed(view)
            view.history = merged_history(view.history, message.samples)
        elif isinstance(message, StacksMsg):
            view = self.view(message.rank)
            self._changed(view)
            view.stacks = message
            if message.stuck is not None:
                view.stuck = message.stuck
            self._touch(at if at is not None else message.time)
        elif isinstance(message, FrTraceMsg):
            view = self.view(message.rank)
            self._changed(view)
            view.fr_trace = message

    def _apply_pulses(self, batch: PulseBatch) -> None:
        """A digest's pulses: what a StateMsg of each does, but the state is merged when read.
        A pulse's detail is a running state (final ones come whole), so the connection is up."""
        views, sinks, detail_sinks = self.ranks, self.dirty_sinks, self.detail_sinks
        latest = self.last_time
        for t, detail, pulse in zip(batch.times, batch.details, batch.pulses, strict=True):
            view = views.get(pulse.rank)
            if view is None:
                view = self.view(pulse.rank)
                self.job_id = self.job_id or detail.job_id
                if detail.world_size > self.world_size:
                    self._grow(detail.world_size)
            view.version += 1
            for sink in sinks:
                sink.add(pulse.rank)
            if view.base is not detail:
                for sink in detail_sinks:
                    sink.add(pulse.rank)
            view.base, view.pulse, view.received_at = detail, pulse, t
            if view.connection != LOST:
                view.connection = CONNECTED
            history, sample = view.history, pulse.sample
            for before in pulse.earlier:  # the samples a wide job's digest carried before it
                if not history or history[-1].time < before.time:
                    history.append(before)
            if not history or history[-1].time < sample.time:
                history.append(sample)
            if t > latest:
                latest = t
            if not self.first_time or t < self.first_time:
                self.first_time = t
        self.last_time = latest

    def _touch(self, t: float) -> None:
        if not self.first_time or t < self.first_time:
            self.first_time = t
        self.last_time = max(self.last_time, t)

    def first_failure(self) -> Ending | None:
        """The rank whose failure came first (see :mod:`ddptop.model.outcome`)."""
        return first_failure(e for e in (v.ending() for v in self.ranks.values()) if e is not None)

    def statuses(self, now: float) -> dict[int, str]:
        """Status word of every rank at *now*, victims of a teardown as ``torn_down``.

        From an index kept up to date with the ranks that changed (the dashboard calls this
        at every redraw, for up to 32,768 ranks); equal to :meth:`_statuses_full`.
        """
        return self._statuses().statuses(now)

    def stale_by_clock(self) -> list[int]:
        """The ranks the last :meth:`statuses` call called stale by the clock alone: the only
        ranks whose status there differs from :meth:`status_words`."""
        return self._statuses().stale_by_clock

    def status_words(self) -> dict[int, str]:
        """Every rank's word but for the clock (a rank heard just now: its word at any moment
        soon), caught up with the ranks that changed; read it, never change it."""
        return self._statuses().words()

    def _statuses(self) -> StatusIndex:
        # Made at the first look: it watches the ranks that change from then on.
        if self._status_index is None:
            self._status_index = StatusIndex(self)
        return self._status_index

    def _statuses_full(self, now: float) -> dict[int, str]:
        """:meth:`statuses` by one loop over every rank: the reference the index is held to."""
        out: dict[int, str] = {}
        ends: dict[int, Ending] = {}
        for rank, view in sorted(self.ranks.items()):
            st = view.state
            if view.exit is None and view.connection != LOST and (st is None or st.status not in FINAL):
                out[rank] = view.live_status(now)  # has not ended: the usual case, checked inline
                continue
            ended = view.ending()
            if ended is None:
                out[rank] = view.live_status(now)
            else:
                out[rank], ends[rank] = ended.status, ended
        if ends:
            first = first_failure(ends.values())
            for rank, ended in ends.items():
                out[rank] = resolved_status(ended, first)
        return out

    def snapshot(self, now: float) -> JobSnapshot:
        """The model as a JobSnapshot (status words resolved at *now*)."""
        states: list[RankState] = []
        unreachable: dict[int, str] = {}
        since: dict[int, float] = {}  # ranks whose connection is open (or opening) but silent
        seen_by: dict[int, str] = {}  # of those, the ones a node agent told: its host
        statuses = self.statuses(now)
        for i, (rank, view) in enumerate(sorted(self.ranks.items())):
            if not i % EVERY:  # merging a pulse costs ~8 us: a long pass at 32,768 ranks
                give_way()
            status = statuses[rank]
            if view.connection == UNREACHABLE:
                since[rank] = view.unreachable_since
                if view.unreachable_seen_by:
                    seen_by[rank] = view.unreachable_seen_by
                unreachable[rank] = view.connection_reason
            stuck = view.current_stuck()
            if view.state is None and stuck is not None:
                # Never heard from by this viewer, but the node agent read it from outside.
                unreachable[rank] = view.connection_reason or "no state received"
                states.append(RankState(rank=rank, local_rank=STUB_LOCAL_RANK, world_size=self.world_size,
                                        host="", pid=stuck.pid, job_id=self.job_id, status=Status.STALE,
                                        time=stuck.since, stuck=stuck))
                continue
            if view.state is None:
                if view.exit is None:
                    unreachable[rank] = view.connection_reason or "no state received"
                    continue
                # Never heard from, but the agent saw it end: its exit is all there is.
                states.append(RankState(rank=rank, local_rank=STUB_LOCAL_RANK, world_size=self.world_size,
                                        host=view.exit.host, pid=view.exit.pid, job_id=self.job_id,
                                        status=status, time=view.exit.time,
                                        **exit_fields(view.exit)))  # type: ignore[arg-type]
                continue
            fields = exit_fields(view.exit, view.state.exit_code)
            if status != view.state.status:
                fields["status"] = status
            if stuck is not None:
                fields["stuck"] = stuck
            if status == LOST and view.connection_reason:
                unreachable[rank] = view.connection_reason  # its last state is shown, and why it stopped
            states.append(msgspec.structs.replace(view.state, **fields) if fields else view.state)
        for rank in range(self.world_size):
            if rank not in self.ranks:
                unreachable[rank] = "never seen"
        give_way()
        return build_snapshot(self.job_id, self.world_size, states, unreachable, now, self.places, since,
                              seen_by)

    def copy(self) -> JobModel:
        """An independent copy (states are shared: nothing mutates them), for another thread
        or a replay checkpoint."""
        ranks = {r: dataclasses.replace(v, history=ring(v.history, v.history.maxlen or HISTORY_LEN))
                 for r, v in self.ranks.items()}
        return JobModel(job_id=self.job_id, world_size=self.world_size, ranks=ranks,
                        first_time=self.first_time, last_time=self.last_time, places=dict(self.places))

    def settled(self) -> bool:
        """Every rank of the job (its world size, once a state told it) has sent a state."""
        ranks = self.ranks
        return 0 < self.world_size <= len(ranks) and all(v.base is not None for v in ranks.values())

    def shared_copy(self) -> JobModel:
        """A copy whose views are new but share their history deques with this model's (the
        dashboard's background diagnosis: copying 4096 windows of samples cost the UI thread
        20-40 ms; its readers take a deque only through C-level calls, see recent_samples)."""
        return self.with_views({r: view_copy(v) for r, v in self.ranks.items()})

    def with_views(self, ranks: dict[int, RankView]) -> JobModel:
        """A model of this job whose views are *ranks*: copies of this model's views as they are
        now, every rank, in this model's order (:meth:`shared_copy`, or
        :class:`~ddptop.model.sliced_copy.SlicedCopy` a slice at a time)."""
        copied = JobModel(job_id=self.job_id, world_size=self.world_size, ranks=ranks,
                          first_time=self.first_time, last_time=self.last_time, places=dict(self.places))
        if self._status_index is not None:  # the copy's first statuses() need not walk every rank
            copied._status_index = self._status_index.copy_for(copied)
        return copied

    def steps(self, ranks: Iterable[int]) -> dict[int, int]:
        """The last step of each of *ranks* (0 for a rank not heard from yet)."""
        return {r: v.state.step if v is not None and v.state is not None else 0
                for r, v in ((r, self.ranks.get(r)) for r in ranks)}

    def histories(self) -> dict[int, list[Sample]]:
        """Every rank's samples, oldest first."""
        return {r: list(v.history) for r, v in sorted(self.ranks.items())}


def view_copy(view: RankView) -> RankView:
    """A new view with every field of *view* as it is (its history deque shared)."""
    # Every field as it is (a shallow copy): its attribute dict copied whole, at 0.4 us a view
    # against 0.95 us through the constructor (32,768 views on the UI thread every few seconds).
    copied = object.__new__(RankView)
    copied.__dict__ = view.__dict__.copy()
    return copied


def is_stub(state: RankState) -> bool:
    """A state a viewer made for a rank that could not tell (``STUB_LOCAL_RANK``): how it ended,
    from what it left on disk, with none of its numbers."""
    return state.local_rank == STUB_LOCAL_RANK


def ended_over(known: RankState, stub: RankState) -> RankState:
    """*known* (the rank's last sample or words) with the end a *stub* tells: a stub never
    erases what is known of a rank (its step, loaders, collectives, memory). Progress the
    stub has from the rank's progress page (a later step) wins."""
    fields: dict[str, object] = {"status": stub.status, "time": max(known.time, stub.time),
                                 "exit_reason": stub.exit_reason or known.exit_reason,
                                 "crash_file": stub.crash_file or known.crash_file}
    if stub.step > known.step or (stub.loaders and stub.step == known.step):
        fields.update(step=stub.step, last_step_at=stub.last_step_at, epoch=stub.epoch, batch=stub.batch,
                      batches_per_epoch=stub.batches_per_epoch, loaders=stub.loaders or known.loaders)
    return msgspec.structs.replace(known, **fields)

