"""The innermost cause of an error as Python and torch print it: under the wrapper, under the chain.

Three wrappers hide the error a person needs:

* a DataLoader worker's exception reaches the rank as ``RuntimeError: Caught RuntimeError in
  DataLoader worker process 0.`` followed by ``Original Traceback (most recent call last):``
  and the worker's own traceback, its error last;
* ``torch.multiprocessing.spawn`` raises ``ProcessRaisedException: -- Process 1 terminated
  with the following error:`` followed by the child's traceback;
* chained exceptions print the innermost first ("The above exception was the direct cause of
  the following exception:", "During handling of the above exception, another exception
  occurred:"), so the last line of the text is the outermost wrapper.

:func:`innermost` reads such text (a traceback, an exception's message, a rank's exit reason)
and returns the innermost error's own line and the outermost wrapper's, for a one-line cause
"X (raised as Y)". Pure text, bounded, no regex that can backtrack: used inside ranks (the
reporter's exit reason), by the log readers and by the diagnosis alike.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_LINES = 4000
_ERROR = re.compile(r"^[A-Za-z_][\w.]{0,120}(?:Error|Exception|Interrupt|Exit|NotMet|Warning)\b:? ?"
                    r".{0,2000}$")
_CHAINED = ("The above exception was the direct cause of the following exception",
            "During handling of the above exception, another exception occurred")
_INNER = ("Original Traceback (most recent call last)", "terminated with the following error")
WRAPPERS = re.compile(r"Caught \w{1,80} in DataLoader worker process \d{1,6}|ProcessRaisedException"
                      r"|terminated with the following error")


_TOLD = re.compile(r"^(.{1,2000}?) \(raised as (.{1,800})\)$")


class Cause(NamedTuple):
    """The innermost error's line, and the outermost one's where it differs ("" if not)."""

    error: str
    wrapper: str = ""

    def text(self, limit: int = 400) -> str:
        """'OSError: ... (raised as RuntimeError: Caught OSError in DataLoader worker process 0.)'"""
        if not self.wrapper or self.wrapper == self.error:
            return self.error[:limit]
        return f"{self.error} (raised as {self.wrapper})"[:limit]


def _errors(lines: list[str]) -> list[str]:
    return [ln.strip() for ln in lines if _ERROR.match(ln.strip()) and not ln.startswith((" ", "\t"))]


def innermost(text: str) -> Cause:
    """The innermost error of *text* and its outermost wrapper (see the module)."""
    lines = text.splitlines()[:MAX_LINES]
    if not lines:
        return Cause("")
    told = _TOLD.match(lines[0].strip())
    if told and _ERROR.match(told.group(1)):  # already read (a rank's exit reason leads with it)
        return Cause(told.group(1), told.group(2))
    everything = _errors(lines)
    if not everything:
        stripped = [ln.strip() for ln in lines if ln.strip()]
        return Cause(stripped[-1][:2000] if stripped else "")
    outermost = everything[-1]
    # A chain prints its innermost exception first: cut the text at the first chain marker.
    first_block = lines
    for i, line in enumerate(lines):
        if any(marker in line for marker in _CHAINED):
            first_block = lines[:i]
            break
    inner = _errors(first_block) or everything
    # Inside that block, a wrapper's message carries the original traceback after its own
    # line: the last error line of the block is the original error.
    cause = inner[-1]
    if any(marker in line for line in first_block for marker in _INNER) or cause != outermost:
        wrapper = next((e for e in everything if WRAPPERS.search(e)), outermost)
        return Cause(_clean(cause), _clean(wrapper) if wrapper != cause else "")
    return Cause(_clean(cause))


def _clean(line: str) -> str:
    # describe_exception appends " (file:line in f; ...)": the frames are said elsewhere.
    return re.sub(r" \((?:[^()]{0,300}:\d{1,7} in [^()]{0,200}(?:; )?){1,4}\)$", "", line)[:2000]
