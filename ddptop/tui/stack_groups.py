"""Group identical stacks across ranks: "ranks 0-2,5: all_reduce <- backward <- train.py:41".

Pure. A rank's *signature* is its main thread's frames (innermost first); ranks with the
same signature form one group. Frames inside the standard library and torch are kept in
the full listing but the one-line summary prefers the innermost function names and the
innermost frame of user code, which is what a person recognises.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddptop.protocol import FrameStack, StacksMsg, ThreadStack
from ddptop.textfmt import rank_ranges

SUMMARY_FUNCS = 3  # innermost function names in a one-line summary
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen")


@dataclass
class StackGroup:
    """Ranks that share one main-thread stack."""

    ranks: list[int]
    thread: ThreadStack

    @property
    def label(self) -> str:
        """'rank 3' or 'ranks 0-2,5'."""
        return ("rank " if len(self.ranks) == 1 else "ranks ") + rank_ranges(self.ranks)

    def summary(self) -> str:
        """'ranks 0-2: all_reduce <- backward <- train.py:41'."""
        return f"{self.label}: {summarize(self.thread.frames)}"


def main_thread(msg: StacksMsg) -> ThreadStack | None:
    """The rank's main thread (the training loop), else its first thread."""
    for thread in msg.threads:
        if thread.is_main:
            return thread
    return msg.threads[0] if msg.threads else None


def is_user_frame(frame: FrameStack) -> bool:
    """False for frames of the standard library, site-packages and frozen modules."""
    return not any(marker in frame.file for marker in _LIBRARY_MARKERS)


def summarize(frames: list[FrameStack]) -> str:
    """Innermost functions, then the innermost user frame as file:line."""
    if not frames:
        return "(no Python frames)"
    inner = list(reversed(frames))  # frames are outermost first, like a traceback
    names: list[str] = []
    for frame in inner:
        if frame.function not in names:
            names.append(frame.function)
        if len(names) == SUMMARY_FUNCS:
            break
    user = next((f for f in inner if is_user_frame(f)), inner[0])
    where = f"{user.file.rsplit('/', 1)[-1]}:{user.line}"
    return " ← ".join([*names, where])


def _signature(thread: ThreadStack) -> tuple[tuple[str, int, str], ...]:
    return tuple((f.file, f.line, f.function) for f in thread.frames)


def group_stacks(stacks: dict[int, StacksMsg]) -> list[StackGroup]:
    """Groups of ranks with identical main-thread stacks, largest group first."""
    groups: dict[tuple[tuple[str, int, str], ...], StackGroup] = {}
    for rank, msg in sorted(stacks.items()):
        thread = main_thread(msg)
        if thread is None:
            continue
        sig = _signature(thread)
        if sig in groups:
            groups[sig].ranks.append(rank)
        else:
            groups[sig] = StackGroup(ranks=[rank], thread=thread)
    return sorted(groups.values(), key=lambda g: (-len(g.ranks), g.ranks[0]))


def render_groups(groups: list[StackGroup], errors: dict[int, str] | None = None) -> str:
    """The stacks screen's text: one summary line per group, then its full stack."""
    lines: list[str] = []
    for group in groups:
        lines.append(group.summary())
        for frame in reversed(group.thread.frames):
            lines.append(f"    {frame.function}  {frame.file}:{frame.line}")
        lines.append("")
    for rank, why in sorted((errors or {}).items()):
        lines.append(f"rank {rank}: no stack ({why})")
    return "\n".join(lines).rstrip() or "no stacks received"
