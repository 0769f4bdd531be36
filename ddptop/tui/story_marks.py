"""The findings' story on the rank table: which rows are the cause, and whom each victim waits for.

The wait-for graph (:mod:`ddptop.diagnosis.wait_graph`) gives each finding of an event its
culprits (``ranks`` less ``victims``) and, for a hang, what each victim waits in and for whom
(``Finding.waits``). The table leads with the culprits' rows, marked ``CAUSE``, and shows on a
victim's row whom it waits for (``→2``, ``→0,2``): the chain reads from the table alone. A
victim of a failure (a teardown, a peer gone) without an edge reads ``VICTIM``; a rank that
shares a limit about to run out reads what and when (``OOM ⏱4m10s``). Pure.
"""

from __future__ import annotations

from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.story import EVENT_KINDS, culprits
from ddptop.textfmt import human_duration, rank_ranges

CAUSE = "CAUSE"
VICTIM = "VICTIM"
MAX_TARGET_CHARS = 12  # "→0-3,5" fits the flags column beside the desync marks
# A rank sharing a limit that runs out soon: the word and the time left, as the pending op's
# countdown to its timeout shows it (the forecast of rules_resources, fresh each diagnosis)
AT_RISK = {"memory_exhaustion": "OOM", "shm_exhaustion": "SHM", "disk_exhaustion": "DISK"}


def story_marks(findings: list[Finding]) -> tuple[dict[int, str], list[int]]:
    """({rank: word}, the culprits in the findings' order) for the warning-or-worse events."""
    marks: dict[int, str] = {}
    leads: list[int] = []
    for f in findings:
        if f.kind not in EVENT_KINDS or not f.at_least("warning"):
            continue
        for edge in f.waits:
            target = rank_ranges(edge.waits_for) if edge.waits_for else "?"
            word = "→" + (target if len(target) <= MAX_TARGET_CHARS else target[:MAX_TARGET_CHARS - 1] + "…")
            for r in edge.ranks:
                marks.setdefault(r, word)
        for r in f.victims:
            marks.setdefault(r, VICTIM)
        if f.certain:
            for r in sorted(culprits(f)):
                marks[r] = CAUSE
                if r not in leads:
                    leads.append(r)
    for f in findings:  # after the events: a cause or a wait says more than a risk
        risk = AT_RISK.get(f.kind)
        if risk is None or f.forecast is None or not f.at_least("warning"):
            continue
        for r in f.ranks:
            marks.setdefault(r, f"{risk} ⏱{human_duration(f.forecast.eta_s)}")
    return marks, leads
