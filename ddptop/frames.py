"""The user's frame in a stack: where in *their* code a rank is, torch's and ddptop's frames skipped.

A rank waiting in a collective is, innermost, inside torch (``distributed_c10d.py``); a rank
asleep in a data loader is inside ``threading.py`` or ``queue.py``. What a person needs is
the innermost frame of their own code: the training loop line that called the collective,
the hook that sleeps. :func:`user_frame` finds it in a stack (innermost last, like a
traceback) read in-process by the reporter, from outside by the node agent, or kept by a
Flight Recorder dump. Pure, by path: the stack may come from another machine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ddptop.rank_state import FrameStack

# torch (and its compiled helpers), ddptop itself, Python's standard library and runpy's
# start-up frames: never the user's code.
_NOT_THEIRS = re.compile(r"(?:^|/)(?:torch|torchgen|functorch|ddptop)/|^<frozen |^<string>$"
                         r"|/lib/python3(?:\.\d{1,2})?/(?!site-packages/|dist-packages/)[^/]{1,100}(?:\.py|/)")


def theirs(frame: FrameStack) -> bool:
    """True where *frame* is in the user's code (not torch, ddptop or the standard library)."""
    return not _NOT_THEIRS.search(frame.file)


def user_frame(frames: Sequence[FrameStack]) -> FrameStack | None:
    """The innermost frame of the user's code in *frames* (innermost last), None if none."""
    for frame in reversed(frames):
        if theirs(frame):
            return frame
    return None


def frame_text(frame: FrameStack) -> str:
    """'train.py:57 in hook' (the path shortened to its last two parts)."""
    parts = frame.file.rsplit("/", 2)
    short = "/".join(parts[-2:]) if len(parts) > 2 else frame.file
    return f"{short}:{frame.line} in {frame.function}"
