"""Where each culprit is in the user's code, added to the findings that name it (#34 item 2).

A finding that names a cause (a hang's culprit, a straggler) gets, per culprit, its place in
the code: the frame the rank's own reporter read in-process while it made no progress
(``RankState.where``), else the frame read from outside by its node agent for a rank that
stopped answering (``RankState.stuck``); the innermost frame outside torch, ddptop and the
standard library (:func:`ddptop.frames.user_frame`). Pure: findings and snapshot in.
"""

from __future__ import annotations

import msgspec

from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.story import EVENT_KINDS, culprits
from ddptop.frames import frame_text, user_frame
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState

KINDS = EVENT_KINDS | {"straggler", "input_bound"}
MAX_RANKS = 4  # frames added to one finding


def where_line(state: RankState) -> str:
    """'rank 2 is at train.py:57 in hook (...)', or '' where nothing says where it is."""
    if state.where is not None:
        return (f"rank {state.rank} is at {frame_text(state.where)} (its main thread, read in-process while "
                "it made no progress)")
    stuck = state.stuck
    frame = user_frame(stuck.frames) if stuck is not None else None
    if stuck is not None and frame is not None:
        return (f"rank {state.rank} is at {frame_text(frame)} (read from outside by its node agent: "
                f"{stuck.source})")
    return ""


def with_frames(findings: list[Finding], snapshot: JobSnapshot) -> list[Finding]:
    """*findings*, each that names a cause with its culprits' places in the code added."""
    states: dict[int, RankState] | None = None
    out: list[Finding] = []
    for f in findings:
        named = sorted(culprits(f)) if f.kind in KINDS and f.at_least("warning") else []
        if not named:
            out.append(f)
            continue
        if states is None:
            states = snapshot.by_rank()
        lines = [line for r in named[:MAX_RANKS] if r in states
                 if (line := where_line(states[r])) and line not in f.evidence]
        out.append(msgspec.structs.replace(f, evidence=[*f.evidence, *lines]) if lines else f)
    return out
