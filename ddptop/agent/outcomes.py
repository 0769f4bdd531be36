"""How this host's ranks ended, for ``job.json``: read off the agent's model, never kept beside it.

The node agent folds every ending it sees (a rank's last words, its exit, a lost node) into
its :class:`~ddptop.model.job.JobModel`, and the same events go into the black box. ``job.json``
(:mod:`ddptop.store.jobrecord`) is written from that model by :func:`rank_outcomes`, so
``ddptop jobs`` and ``doctor`` (which folds the record into a model of its own) cannot tell two
stories. A rank whose end the agent never saw by the time the command ended is not quietly
written down as "lost": :class:`LostAtFinish` makes that verdict an event, which goes into the
record and the model like any other.
"""

from __future__ import annotations

import logging
import time

from ddptop.errors import DdptopError
from ddptop.model.job import JobModel
from ddptop.model.outcome import Ending
from ddptop.model.rank_view import RankView
from ddptop.protocol import ConnectionEvent
from ddptop.status import FINAL, Status
from ddptop.store import jobrecord
from ddptop.store.jobrecord import JobRecord, RankOutcome

log = logging.getLogger(__name__)

LOST_AT_FINISH = "no end of it was seen before the command ended"  # the verdict's reason
MAX_REASON = 300  # characters of a rank's last word kept in job.json


def _ending(view: RankView | None, pid: int) -> Ending | None:
    """How the process *pid* of *view*'s rank ended, or None while it runs. An exit or last
    words of another pid are an earlier incarnation's (torchrun restarted the rank)."""
    if view is None:
        return None
    if view.exit is not None and view.exit.pid != pid:
        return None
    state = view.state
    if view.exit is None and state is not None and state.status in FINAL and state.pid != pid:
        return None
    return view.ending()


def rank_outcomes(model: JobModel, local: dict[int, int], now: float) -> list[RankOutcome]:
    """``job.json``'s outcome of each local rank (*local*: rank -> its current pid), all from *model*:
    the status word with job context (``torn_down``...), the exit, the rank's own last word."""
    statuses = model.statuses(now)
    outcomes: list[RankOutcome] = []
    for rank, pid in sorted(local.items()):
        view = model.ranks.get(rank)
        ending = _ending(view, pid)
        if view is None or ending is None:
            outcomes.append(RankOutcome(rank=rank, pid=pid, status=Status.RUNNING))
            continue
        exit = view.exit
        state = view.state
        reason = state.exit_reason if state is not None and state.pid == pid else ""
        outcomes.append(RankOutcome(rank=rank, pid=pid, status=statuses[rank],
                                    exit_code=exit.exit_code if exit is not None else None,
                                    signal=exit.signal if exit is not None else "",
                                    time=exit.time if exit is not None else ending.time,
                                    reason=reason[:MAX_REASON]))
    return outcomes


class LostAtFinish:
    """The agent's verdict on local ranks whose end it never saw when the command ended.

    The time of a verdict is when the rank's connection was first lost, if the live source
    said so (that event is in the record too, and a model keeps the first loss), else the
    moment of the verdict: the agent's model and the record's then agree on when, not only on
    "lost", and so on which rank failed first.
    """

    def __init__(self) -> None:
        self._connection_lost: dict[int, float] = {}  # rank -> first "lost" from the live source

    def saw(self, event: ConnectionEvent) -> None:
        """A connection event of the live source (its thread)."""
        if event.status == Status.LOST:
            self._connection_lost.setdefault(event.rank, event.time)

    def verdicts(self, model: JobModel, local: dict[int, int], now: float) -> list[ConnectionEvent]:
        """One ``lost`` event for each of *local* (rank -> pid) that has no known end in *model*."""
        return [ConnectionEvent(time=self._connection_lost.get(rank, now), rank=rank, status=Status.LOST,
                                reason=LOST_AT_FINISH)
                for rank, pid in sorted(local.items()) if _ending(model.ranks.get(rank), pid) is None]


class JobFile:
    """``job.json`` of one job on this host: what the job is, from the agent; how its ranks
    ended, from the model at every write. Not thread-safe: the agent writes under its lock."""

    def __init__(self, record: JobRecord) -> None:
        self.record = record
        self.written_at = 0.0  # time.monotonic() of the last write (tried)
        self._warned = False

    def write(self, model: JobModel, local: dict[int, int], exchange: str, record_bytes: int) -> None:
        """Rewrite ``job.json`` (a failure is logged once: the watching goes on)."""
        record = self.record
        record.ranks = rank_outcomes(model, local, time.time())
        record.world_size = max(record.world_size, model.world_size)
        record.exchange, record.record_bytes = exchange, record_bytes
        try:
            jobrecord.write_record(record)
        except (OSError, DdptopError) as exc:
            if not self._warned:
                log.warning("ddptop agent: cannot write the job record: %s", exc)
            self._warned = True
        self.written_at = time.monotonic()

    def recording_failed(self, exc: Exception) -> None:
        """A write of the black box failed: counted, and the first one said."""
        self.record.record_errors += 1
        if self.record.record_errors == 1:  # once: a full disk fails every second after
            self.record.record_note = f"recording failed: {exc}"
            log.warning("ddptop agent: recording failed: %s (what was recorded stays readable)", exc)
