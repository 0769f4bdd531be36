"""Where the main thread is in the user's code, read in-process while the rank makes no progress.

``sys._current_frames()`` hands the reporter thread the main thread's current frame object:
the interpreter's own bookkeeping, no signal and no ptrace, so looking never changes the job.
It works while the main thread waits in a gloo or NCCL call (they release the GIL) and while
it runs Python (a hook that sleeps, a slow data path: the reporter's own sample waits for the
GIL like any thread). Read only once the rank has made no step for WHERE_AFTER_S, so a
healthy rank sends nothing more; the innermost frame outside torch, ddptop and the standard
library is kept (:func:`ddptop.frames.user_frame`).
"""

from __future__ import annotations

import sys
import threading
from types import FrameType

from ddptop.frames import user_frame
from ddptop.protocol import FrameStack, RankState

WHERE_AFTER_S = 2.0  # as the viewers' "stuck" (diagnosis/desync.STUCK_AFTER_S)
MAX_FRAMES = 64


def main_thread_frames() -> list[FrameStack]:
    """The main thread's stack, innermost last ([] where it cannot be read)."""
    frame: FrameType | None = sys._current_frames().get(threading.main_thread().ident or -1)
    out: list[FrameStack] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        out.append(FrameStack(file=code.co_filename, line=frame.f_lineno or 0, function=code.co_name))
        frame = frame.f_back
    out.reverse()
    return out


def sample_where(s: RankState, now: float) -> None:
    """Set ``s.where`` while the rank makes no progress, clear it once it does."""
    since = s.last_step_at or s.start_time
    # A job whose steps take 5 s is not stalled at 2 s: three of its own steps, at least 2 s.
    after = max(WHERE_AFTER_S, 3 * (s.step_time_s or 0.0))
    if s.status not in ("running", "starting") or not since or now - since < after:
        s.where = None
        return
    s.where = user_frame(main_thread_frames())
