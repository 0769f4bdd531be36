"""Python stacks of every thread, taken from the reporter thread.

``sys._current_frames()`` works while the main thread waits inside a gloo or NCCL
collective, because those calls release the GIL while they wait.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType

from ddptop.protocol import FrameStack, ThreadStack

MAX_FRAMES = 64


def all_thread_stacks(skip_self: bool = True) -> list[ThreadStack]:
    """Every thread's stack, innermost frame last; the reporter's own thread skipped."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    me = threading.get_ident()
    out: list[ThreadStack] = []
    for thread_id, frame in sys._current_frames().items():
        if skip_self and thread_id == me:
            continue
        frames: list[FrameStack] = []
        current: FrameType | None = frame
        while current is not None and len(frames) < MAX_FRAMES:
            code = current.f_code
            frames.append(FrameStack(file=code.co_filename, line=current.f_lineno or 0,
                                     function=code.co_name))
            current = current.f_back
        frames.reverse()
        out.append(ThreadStack(thread_id=thread_id, name=names.get(thread_id, "?"),
                               frames=frames, is_main=thread_id == main_id))
    out.sort(key=lambda t: (not t.is_main, t.name))
    return out
