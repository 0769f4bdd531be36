"""Collective-op sequence numbers and the Flight Recorder, per process group.

The source of truth is c10d itself, not wrappers around ``dist.*`` (which are blind to
DDP's C++ bucketed all-reduce): ``pg._get_sequence_number_for_group()`` counts every
collective of the group, and the Flight Recorder lists the ops a rank entered.

Gloo and NCCL differ in what FR says: NCCL moves ``state`` through scheduled / started
/ completed, gloo leaves it at "scheduled" and keys ``pg_config`` by an empty name. So
"pending" here means: not retired, not completed, and beyond the group's
``last_completed_collective`` from ``pg_status``. This works for both.

Cost: a full FR dump (2000 entries) holds the GIL for ~40-60 ms on this machine; a
status-only dump (``includeCollectives=False``: each group's last enqueued / completed
seq) costs ~20 us. So a stalled group is first checked with the status dump, and the
full dump is read only when a stalled group has an op enqueued and not completed that
the last full read did not see, at most ``FR_FULL_READS_PER_MIN`` times a minute
whatever the number of groups. An idle group (everything it enqueued completed) never
triggers a full read, and neither does a healthy job: the enqueue times that name a
straggler are observed by :mod:`ddptop.reporter.enqueue_timer` (polled seqs, in bursts on
shared wall-clock ticks), not read from a dump (#57). Full dumps are decoded with typed
msgspec structs (only the fields used).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ddptop.protocol import CollectiveGroup, PendingOp
from ddptop.reporter.enqueue_timer import EnqueueTimer
from ddptop.reporter.fr_read import (  # re-exported: where callers have always found them
    RECENT_PER_GROUP,
    FrDump,
    FrEntry,
    FrPgStatus,
    decode_fr,
    pending_from_dump,
    pending_from_fr,
    read_fr_json,
    recent_ops,
)
from ddptop.reporter.p2p_wait import blocked_p2p

__all__ = ["RECENT_PER_GROUP", "CollectiveTracker", "FrDump", "FrEntry", "FrPgStatus", "decode_fr",
           "pending_from_dump", "pending_from_fr", "read_fr_json",
           "recent_ops"]

ENQUEUE_TIMES_KEPT = 64  # milestones per group sent to viewers (~1 KB)
# Full FR dumps per minute at most (read only while a group stands still with an op in flight).
FR_FULL_READS_PER_MIN = 6
# Re-read spacing while stalled when this torch's FR has no per-group status.
FR_STATUSLESS_REFRESH_S = 10.0
# Subgroups whose members are sent with every state (their list is made once): what lets a
# viewer follow a wait from one group into another while a member is silent or dead. Larger
# groups are known from the ranks that report them.
MEMBERS_SENT_UP_TO = 1024
# A stalled group's last ops sent with it (from the same full read as its pending ops): where
# two ranks of a two-rank group disagree at one seq, the same seq of a sibling group (another
# tensor-parallel pair) says which of them left the program's order.
RECENT_WHILE_STALLED = 4


class CollectiveTracker:
    """Remembers when each group's seq last moved, and reads FR when one stalls."""

    def __init__(self, fr_after_s: float = 2.0, timing_every_s: float = 30.0,
                 full_reads_per_min: int = FR_FULL_READS_PER_MIN,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.fr_after_s = fr_after_s
        # Seconds between the enqueue timer's bursts (0: no timer, no enqueue times).
        self.timing_every_s = timing_every_s
        self.full_reads_per_min = full_reads_per_min
        self._on_error = on_error or (lambda exc: None)
        self.timer: EnqueueTimer | None = None
        self._last_seq: dict[str, tuple[int, float]] = {}
        self._pending: dict[str, list[PendingOp]] = {}
        self._seen_enqueued: dict[str, int] = {}  # FR pg_id -> last enqueued at the last full read
        self._full_reads: deque[float] = deque()  # times of full reads in the last minute
        self._last_full_read = 0.0
        self._pg_ids: dict[str, str] = {}  # group name -> FR pg_id (learned from entries)
        self._unmapped: set[str] = set()  # groups the last full read showed no entry of
        self._milestones: dict[str, dict[int, float]] = {}
        self._recent: dict[str, list[PendingOp]] = {}  # group name -> its last ops, read while stalled
        self._status: dict[str, FrPgStatus] = {}  # FR pg_id -> the group's counters, read while stalled
        self._members: dict[str, list[int]] = {}  # group name -> global ranks (subgroups only)
        self._p2p_seen: dict[tuple[str, str, int | None], float] = {}  # blocking send/recv -> first seen
        self.backend = ""
        self.status_reads = 0
        self.full_reads = 0

    def groups(self, c10d: Any, now: float) -> list[CollectiveGroup]:
        """Read every group's seq; attach pending ops from FR when a group stalls."""
        world = c10d._world
        names = dict(world.pg_names)
        groups: list[CollectiveGroup] = []
        stalled: list[str] = []
        for pg, entry in list(world.pg_map.items()):
            try:
                seq = int(pg._get_sequence_number_for_group())
            except Exception:  # a group that is not ready yet
                continue
            name = _group_id(pg, names)
            last = self._last_seq.get(name)
            if last is None or last[0] != seq:
                self._last_seq[name] = (seq, now)
                self._unmapped.discard(name)
                self._pending.pop(name, None)
                changed_at = now
            else:
                changed_at = last[1]
                if now - changed_at >= self.fr_after_s:
                    stalled.append(name)
            backend = str(entry[0]) if isinstance(entry, tuple) and entry else ""
            if name == "0" or not self.backend:
                self.backend = self.backend or backend
            size = int(pg.size())
            groups.append(
                CollectiveGroup(
                    pg=name,
                    seq=seq,
                    desc=str(getattr(pg, "group_desc", "") or names.get(pg, "")),
                    size=size,
                    backend=backend,
                    seq_changed_at=changed_at,
                    ranks=self._members_of(c10d, pg, name, size),
                )
            )
        read_pending = bool(stalled) and self._pending_read_due(stalled, now)
        if not stalled:
            self._pending = {}
            self._recent = {}
            self._status = {}
            self._p2p_seen = {}
        if read_pending and self._full_read_allowed(now):
            dump = decode_fr(read_fr_json(backend=self.backend))
            self._remember_pg_ids(dump)
            self._pending = {name: [self._with_global_peer(name, op) for op in ops]
                             for name, ops in pending_from_dump(dump, now).items()}
            self._recent = recent_ops(dump, RECENT_WHILE_STALLED)
            self._seen_enqueued = {pg_id: st.last_enqueued_collective
                                   for pg_id, st in dump.pg_status.items()}
        self._take_milestones(c10d, groups)
        for group in groups:
            pending = self._pending.get(group.pg, [])
            pg_id = self._pg_id(group.pg) if group.pg in stalled else None
            status = self._status.get(pg_id) if pg_id is not None else None
            if status is not None and status.last_enqueued_collective >= 0:
                group.enqueued = status.last_enqueued_collective
                group.last_completed = status.last_completed_collective
                # FR's own counters: gloo's seq also counts sends and recvs, FR's collective seq does not
                done = status.last_completed_collective
                group.pending = [op for op in pending if op.is_p2p or op.seq > done]
            else:
                # Only ops at or beyond the group's seq can be pending: an op the seq moved
                # past was followed by another, and FR entries may lag behind.
                group.pending = [op for op in pending if op.is_p2p or op.seq >= group.seq]
            for op in group.pending:
                if op.started_at:
                    op.age_s = max(0.0, now - op.started_at)
            if group.pending and group.pending[0].timeout_s is not None:
                group.timeout_s = group.pending[0].timeout_s
            marks = self._milestones.get(group.pg)
            if marks:
                group.enqueue_times = sorted(marks.items())[-ENQUEUE_TIMES_KEPT:]
            if group.pg in stalled:
                group.recent = self._recent.get(group.pg, [])
        if stalled:
            self._add_blocking_p2p(c10d, groups, names, now)
        return groups

    def _with_global_peer(self, name: str, op: PendingOp) -> PendingOp:
        # FR names a p2p op's peer within its group ("nccl:send 0->1"); viewers need the global rank
        if not op.is_p2p or op.peer is None or name == "0":
            return op
        members = self._members.get(name) or []
        op.peer = members[op.peer] if 0 <= op.peer < len(members) else None
        return op

    def _members_of(self, c10d: Any, pg: Any, name: str, size: int) -> list[int]:
        if name == "0" or size > MEMBERS_SENT_UP_TO:
            return []  # the default group is the whole job; a big group is known from its reporters
        members = self._members.get(name)
        if members is None:
            try:
                members = [int(r) for r in c10d.get_process_group_ranks(pg)]
            except Exception:  # a group this rank is not part of, a torch without the call
                members = []
            self._members[name] = members
        return members

    def _add_blocking_p2p(self, c10d: Any, groups: list[CollectiveGroup], names: dict[Any, str],
                          now: float) -> None:
        """The blocking send/recv the main thread is in, as a pending p2p op of its group,
        where the Flight Recorder has none (gloo records no p2p op)."""
        wait = blocked_p2p(c10d)
        if wait is None:
            self._p2p_seen = {}
            return
        pg = wait.group if wait.group is not None else c10d._get_default_group()
        name = _group_id(pg, names)
        group = next((g for g in groups if g.pg == name), None)
        if group is None or any(op.is_p2p for op in group.pending):
            return
        key = (name, wait.direction, wait.peer)
        first = self._p2p_seen.setdefault(key, now)
        self._p2p_seen = {key: first}
        # gloo moves the group's seq as the op is entered: that moment is when the wait began
        began = group.seq_changed_at if "gloo" in (group.backend or self.backend) else first
        group.pending = [*group.pending, PendingOp(
            seq=group.enqueued if group.enqueued is not None else group.seq,
            op=f"{group.backend or self.backend or 'c10d'}:{wait.direction}", started_at=began,
            age_s=max(0.0, now - began), timeout_s=group.timeout_s, state="scheduled", is_p2p=True,
            peer=wait.peer)]

    def _pending_read_due(self, stalled: list[str], now: float) -> bool:
        """Whether a stalled group has an op in flight that the last full read did not see.

        Asks FR's per-group status (cheap); forgets cached pending ops that have
        completed since (an idle rank's seq never moves again, so only FR can tell).
        """
        status = decode_fr(read_fr_json(include_collectives=False, backend=self.backend)).pg_status
        self.status_reads += 1
        self._status = dict(status)
        if not status:  # no per-group status in this torch: re-read, slowly
            return now - self._last_full_read >= FR_STATUSLESS_REFRESH_S
        due = False
        in_flight = any(st.last_enqueued_collective > st.last_completed_collective for st in status.values())
        for name in stalled:
            pg_id = self._pg_id(name)
            if pg_id is None:
                # FR keys its status by its own per-process group id, not the group's name: only a
                # full read's entries tell which is which (a group that never ran a collective has
                # none). Worth a read only while some op is in flight: idle groups never cost one.
                due = due or (in_flight and self._last_seq.get(name, (0, 0.0))[0] > 0
                              and name not in self._unmapped)
                continue
            st = status.get(pg_id)
            if st is None:
                continue
            kept = [op for op in self._pending.get(name, []) if op.seq > st.last_completed_collective]
            if kept:
                self._pending[name] = kept
            else:
                self._pending.pop(name, None)
            if st.last_enqueued_collective > st.last_completed_collective and \
                    st.last_enqueued_collective > self._seen_enqueued.get(pg_id, -1):
                due = True
        return due

    def _full_read_allowed(self, now: float) -> bool:
        """At most ``full_reads_per_min`` full dumps in any minute (counted when granted)."""
        while self._full_reads and now - self._full_reads[0] >= 60.0:
            self._full_reads.popleft()
        if len(self._full_reads) >= self.full_reads_per_min:
            return False
        self._full_reads.append(now)
        self._last_full_read = now
        self.full_reads += 1
        return True

    def _take_milestones(self, c10d: Any, groups: list[CollectiveGroup]) -> None:
        """Keep what the enqueue timer observed since the last sample; start it the first time."""
        if self.timing_every_s <= 0 or not groups:
            return
        if self.timer is None:
            self.timer = EnqueueTimer(self.timing_every_s, lambda: _process_groups(c10d), self._on_error)
            self.timer.start()
        for name, marks in self.timer.take().items():
            kept = self._milestones.setdefault(name, {})
            kept.update(marks)
            for seq in sorted(kept)[:-ENQUEUE_TIMES_KEPT]:
                del kept[seq]

    def close(self) -> None:
        """Stop the enqueue timer (at the rank's exit)."""
        if self.timer is not None:
            self.timer.stop()

    def _pg_id(self, name: str) -> str | None:
        """FR's id of the group *name*, where a full read's entries showed it (the default group is 0)."""
        return self._pg_ids.get(name) or ("0" if name == "0" else None)

    def _remember_pg_ids(self, dump: FrDump) -> None:
        for entry in dump.entries:
            if entry.process_group:
                self._pg_ids[str(entry.process_group[0])] = str(entry.pg_id)
        # Groups the read did not show (no entry left in the buffer) are not worth another read
        # until their seq moves: one read per stall, not one a sample.
        self._unmapped = {name for name in self._last_seq if name not in self._pg_ids}


def _process_groups(c10d: Any) -> list[tuple[str, Any]]:
    """Every process group of this rank with its name (read on the enqueue timer's thread)."""
    world = c10d._world
    if world is None or not c10d.is_initialized():
        return []
    names = world.pg_names  # looked up, not copied: this runs at every poll of a burst
    return [(_group_id(pg, names), pg) for pg in list(world.pg_map)]


def _group_id(pg: Any, names: dict[Any, str]) -> str:
    # FR identifies groups by pg_id / the name c10d gave them ("0", "1", ...).
    try:
        return str(pg.group_name)
    except Exception:
        return str(names.get(pg, "?"))
