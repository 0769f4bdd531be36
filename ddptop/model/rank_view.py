"""What a viewer knows of one rank: its last state (merged from a digest pulse when read),
connection, history ring, stacks, dumps, exit, and the status words it resolves to at a time.

:class:`RankView` is the unit :class:`~ddptop.model.job.JobModel` folds events into and the
status index (:mod:`ddptop.model.status_index`), the dashboard's rows and the node agent's
outcomes read. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ddptop.digest import merged
from ddptop.model.history import ring
from ddptop.model.outcome import Ending, ending_of
from ddptop.protocol import FrTraceMsg, Pulse, RankExit, RankState, Sample, StacksMsg, StuckReport
from ddptop.status import STALE_AFTER_S, Status

# Connection status words, shown in the UI next to colour.
CONNECTED, STALE, LOST = Status.CONNECTED.value, Status.STALE.value, Status.LOST.value
UNREACHABLE = Status.UNREACHABLE.value


@dataclass
class RankView:
    """Everything the viewer knows about one rank."""

    rank: int
    # The rank's last state is base, or base moved to pulse when a pulse came (the digest
    # lane): merged only when read (see the state property), as most pulses never are.
    base: RankState | None = None
    pulse: Pulse | None = None
    received_at: float = 0.0
    connection: str = CONNECTED
    connection_reason: str = ""
    history: deque[Sample] = field(default_factory=ring)  # its length: model.history
    stacks: StacksMsg | None = None
    fr_trace: FrTraceMsg | None = None
    exit: RankExit | None = None  # how the process ended, from the node agent
    lost_at: float | None = None  # when the connection was lost (no exit known)
    unreachable_since: float = 0.0  # connection "unreachable": last heard then (0: never heard)
    unreachable_seen_by: str = ""  # whose verdict that is: a node agent's host ("": this viewer's)
    stuck: StuckReport | None = None  # where it is stuck, read from outside by the node agent
    # Events folded into this view so far: what the table's row memo compares (one int,
    # not the state, the history deque and its tail) to find the few ranks that changed.
    version: int = 0

    @property
    def state(self) -> RankState | None:
        """The rank's last state (a pulse and its detail are merged here, once)."""
        if self.pulse is not None:
            if self.base is not None:
                self.base = merged(self.base, self.pulse)
            self.pulse = None
        return self.base

    @state.setter
    def state(self, value: RankState | None) -> None:
        self.base, self.pulse = value, None

    @property
    def state_time(self) -> float:
        """When the rank's last state was sampled, on its clock (0: none), without a merge."""
        if self.pulse is not None:
            return self.pulse.sample.time
        return self.base.time if self.base is not None else 0.0

    def current_stuck(self) -> StuckReport | None:
        """The stuck report, unless a state arrived after it (the rank answers again)."""
        if self.stuck is None or self.ending() is not None:
            return None
        if self.state_time > self.stuck.time:
            return None
        return self.stuck

    def ending(self) -> Ending | None:
        """How this rank ended, before job context (None while it runs)."""
        # base: the words of an ending are detail fields, and a pulse never carries last words
        return ending_of(self.rank, self.exit, self.base,
                         self.lost_at if self.connection == LOST else None)

    def status(self, now: float, stale_after_s: float = STALE_AFTER_S) -> str:
        """The rank's own status word at *now* (the model adds torn_down with job context)."""
        ended = self.ending()
        return ended.status if ended is not None else self.live_status(now, stale_after_s)

    def live_status(self, now: float, stale_after_s: float = STALE_AFTER_S) -> str:
        """The status word of a rank that has not ended (connection, staleness, its own word)."""
        if self.connection == LOST:
            return LOST
        if self.stuck is not None and self.current_stuck() is not None:
            return STALE  # its node agent found it silent and said where: no need to wait longer
        if self.base is None:
            return "starting" if self.connection == CONNECTED else self.connection
        if self.connection == STALE or now - self.received_at > stale_after_s:
            return STALE
        return self.base.status  # a detail field: no merge needed
