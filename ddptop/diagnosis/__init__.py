"""Diagnosis: pure rules over a job's state that name what is wrong, why, and what to do.

``diagnose(snapshot, histories, now)`` runs every rule; ``findings_for_model(model, now)``
is the same for a :class:`~ddptop.model.job.JobModel` (the TUI's findings panel, replay
and ``ddptop doctor`` call it). Rules and thresholds: ``docs/diagnosis.md``.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from itertools import islice
from operator import attrgetter

from ddptop.diagnosis.claims import Claim
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.engine import RULES, diagnose
from ddptop.diagnosis.finding import KINDS, SEVERITY_ORDER, Finding, FindingsReport
from ddptop.model.job import JobModel
from ddptop.model.pace import EVERY, give_way
from ddptop.protocol import Sample
from ddptop.status import ENDED, Status

GONE = ENDED | {Status.STALE}
HISTORY_MARGIN_S = 10.0

__all__ = [
    "KINDS", "RULES", "SEVERITY_ORDER", "DiagnosisConfig", "Finding", "FindingsReport", "diagnose",
    "findings_for_model", "recent_histories", "recent_samples",
]


def findings_for_model(model: JobModel, now: float, config: DiagnosisConfig | None = None,
                       claims: Sequence[Claim] = ()) -> list[Finding]:
    """Findings for the job as *model* knows it at *now* (most severe first), with what a
    console log's *claims* prove (evidence files: :class:`ddptop.bundle.reader.Contents`)."""
    config = config or DiagnosisConfig()
    # The rate rules look back window_s from now; the margin covers ranks whose clocks run
    # a little behind the viewer's. More history only costs: at 4096 ranks every sample
    # copied is a cache miss (~60 ms per 30 s of samples).
    span = config.window_s + HISTORY_MARGIN_S
    return diagnose(model.snapshot(now), recent_histories(model, now, span), now, config, claims=claims)


def recent_histories(model: JobModel, now: float, span_s: float) -> dict[int, list[Sample]]:
    """Each running rank's samples of the last *span_s* seconds; whole histories of gone ranks.

    The rate rules only look at a recent window, and copying an hour of history for
    thousands of ranks once a second would cost the dashboard more than the rules do.
    Ranks that are gone keep everything: "last alive at step N" needs their last samples.
    """
    out: dict[int, list[Sample]] = {}
    since = now - span_s
    # The model's status index (kept up to date by apply; the snapshot just asked it for the
    # same *now*) instead of each view's status: a call per rank cost ~2.5 us, 80 ms at 32,768.
    # An ended rank's word with job context (torn_down) is gone as its own word is.
    statuses = model.statuses(now)
    for i, (rank, view) in enumerate(model.ranks.items()):
        if not i % EVERY:
            give_way()
        status = statuses.get(rank)
        if (status if status is not None else view.status(now)) in GONE:
            out[rank] = list(view.history)
            continue
        out[rank] = recent_samples(view.history, since)
    return out


def recent_samples(history: Sequence[Sample] | deque[Sample], since: float) -> list[Sample]:
    """The samples taken at or after *since*, oldest first (*history* is time-ordered).

    One C-level bisect and one C-level copy of the tail: the dashboard calls this for
    every rank once a second (a Python loop per rank cost it tens of milliseconds at 4096
    ranks). The background diagnosis calls it on deques that the UI thread appends to:
    the GIL can change hands between making the reversed iterator and consuming it, and
    the deque then refuses to be iterated (RuntimeError), so that case is retried, and
    finally answered from ``list(history)``, a single C call that cannot interleave.
    """
    for _ in range(3):
        try:
            start = bisect.bisect_left(history, since, key=_sample_time)
            tail = list(islice(reversed(history), len(history) - start))
            break
        except RuntimeError:  # deque mutated during iteration: appended meanwhile
            continue
    else:
        tail = [s for s in reversed(list(history)) if s.time >= since]
    tail.reverse()
    while tail and tail[0].time < since:  # an append between bisect and len() shifted the start
        del tail[0]
    return tail


_sample_time = attrgetter("time")
