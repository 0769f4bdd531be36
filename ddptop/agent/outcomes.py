"""How this host's ranks ended, for ``job.json``: read off the agent's model, never kept beside it.

The node agent folds every ending it sees (a rank's last words, its exit, a lost node) into
its :class:`~ddptop.model.job.JobModel`, and the same events go into the black box. ``job.json``
(:mod:`ddptop.store.jobrecord`) is written from that model by :func:`rank_outcomes`, so
``ddptop jobs`` and ``doctor`` (which folds the recording into a model of its own) cannot tell two
stories. A rank whose end the agent never saw by the time the command ended is not quietly
written down as "lost": :class:`LostAtFinish` makes that verdict an event, which goes into the
recording and the model like any other.
"""

from __future__ import annotations

from ddptop.model.job import JobModel
from ddptop.model.outcome import Ending
from ddptop.model.rank_view import RankView
from ddptop.protocol import ConnectionEvent
from ddptop.status import FINAL, Status
from ddptop.store.jobrecord import RankOutcome

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
    said so (that event is in the recording too, and a model keeps the first loss), else the
    moment of the verdict: the agent's model and the recording's then agree on when, not only on
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
