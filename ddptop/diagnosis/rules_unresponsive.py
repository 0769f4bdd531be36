"""rank_unresponsive: a living rank that stopped answering, and where it is stuck.

A rank wedged in C code that holds the GIL, or a SIGSTOPped one, cannot run its reporter:
it only goes stale. The node agent then reads it from outside (py-spy, faulthandler's
signal, /proc; :mod:`ddptop.agent.outside`) and viewers fill ``RankState.stuck``. This rule
says which rank, since when, and where: the main thread's innermost frame, and the process
state when it is stopped.
"""

from __future__ import annotations

import os

from ddptop.diagnosis.common import human_duration
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import FrameStack, Sample, StuckReport
from ddptop.status import ENDED

MAX_EVIDENCE_FRAMES = 8
REMEDY = ("look at the frame it is stuck in: a C extension or custom op that keeps the GIL, a "
          "deadlock, a blocking read; `py-spy dump --native --pid PID` shows more. A rank stopped by "
          "mistake (Ctrl-Z, a debugger) continues with `kill -CONT PID`")


def rank_unresponsive(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                      config: DiagnosisConfig) -> list[Finding]:
    """One critical finding per living rank that the node agent found stuck."""
    out: list[Finding] = []
    for state in snapshot.ranks:
        stuck = state.stuck
        if stuck is None or state.status in ENDED:
            continue
        silent = human_duration(max(0.0, now - stuck.since))
        where = where_text(stuck)
        if is_stopped(stuck):
            title = f"rank {state.rank} is stopped (SIGSTOP): state {stuck.proc_state}, silent for {silent}"
            title += f"; main thread in {where}" if stuck.frames else ""
        else:
            title = f"rank {state.rank} has not answered for {silent}; main thread in {where}"
        out.append(Finding(kind="rank_unresponsive", severity="critical", ranks=[state.rank], title=title,
                           evidence=evidence(stuck), remedy=REMEDY.replace("PID", str(stuck.pid)),
                           since=stuck.since, step=state.step if state.step else None))
    return out


def is_stopped(stuck: StuckReport) -> bool:
    """True if /proc said the process is stopped (SIGSTOP, a debugger)."""
    return stuck.proc_state.startswith(("T", "t"))


def frame_text(frame: FrameStack) -> str:
    """``func() (file.py:88)``."""
    return f"{frame.function}() ({os.path.basename(frame.file)}:{frame.line})"


def where_text(stuck: StuckReport) -> str:
    """The main thread's innermost Python frame, with what holds the GIL or the kernel wait."""
    if not stuck.frames:
        kernel = stuck.wchan or stuck.proc_state or "?"
        return f"an unknown place (no Python stack could be read; kernel: {kernel})"
    frame = stuck.frames[-1]
    text = f"{frame.function}()"
    if stuck.holds_gil:
        text += " holding the GIL"
    text += f" ({os.path.basename(frame.file)}:{frame.line})"
    return f"{text}, in C at {stuck.native[0]}" if stuck.native else text


def evidence(stuck: StuckReport) -> list[str]:
    """How it was read, the process state, and the main thread's frames (innermost first)."""
    lines = [f"read from outside by the node agent via {stuck.source} (pid {stuck.pid})",
             f"process state {stuck.proc_state or '?'}, wchan {stuck.wchan or '?'}"
             + (f", syscall {stuck.syscall}" if stuck.syscall else "")]
    if stuck.holds_gil is not None:
        lines.append(f"the main thread {'holds' if stuck.holds_gil else 'does not hold'} the GIL")
    lines += [f"  at {frame_text(f)}" for f in reversed(stuck.frames[-MAX_EVIDENCE_FRAMES:])]
    lines += [f"  native {n}" for n in stuck.native[:4]]
    if stuck.note:
        lines.append(f"note: {stuck.note}")
    return lines
