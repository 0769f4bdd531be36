"""Crash capture: native stacks on fatal signals, and a rank's last words at exit.

``faulthandler`` writes every thread's stack into a per-rank file when the rank dies of
SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL, and on SIGUSR2 on demand (it works even
while a C call holds the GIL). At interpreter exit the agent writes a last-words file
(final state and the exception, if one killed the rank) for viewers to read post-mortem.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import traceback
from pathlib import Path
from types import TracebackType
from typing import IO, Any

log = logging.getLogger(__name__)

DUMP_SIGNAL = signal.SIGUSR2


class CrashCapture:
    """Owns the crash file and remembers an unhandled exception for the last words."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self.exit_reason = ""
        self._previous_hook: Any = None

    def enable(self) -> bool:
        """Route fatal-signal dumps into the crash file; False if the user already did."""
        if faulthandler.is_enabled():
            return False  # the user configured faulthandler: leave theirs alone
        self._file = open(self.path, "w", buffering=1)  # noqa: SIM115 - lives for the process
        self._file.write(f"# ddptop crash file for pid {__import__('os').getpid()}\n")
        faulthandler.enable(file=self._file, all_threads=True)
        try:
            faulthandler.register(DUMP_SIGNAL, file=self._file, all_threads=True, chain=False)
        except (AttributeError, ValueError, RuntimeError):
            pass
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        return True

    def _excepthook(self, etype: type[BaseException], value: BaseException,
                    tb: TracebackType | None) -> None:
        try:
            frames = traceback.extract_tb(tb)[-3:]
            where = "; ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames)
            self.exit_reason = f"{etype.__name__}: {value} ({where})"[:2000]
        except Exception:
            self.exit_reason = etype.__name__
        previous = self._previous_hook or sys.__excepthook__
        previous(etype, value, tb)

    def crashed(self) -> bool:
        """True if the crash file holds a fatal-signal dump (read by viewers too)."""
        return crash_signal(self.path) is not None


def crash_signal(path: Path) -> str | None:
    """The fatal error faulthandler recorded in *path* ("Segmentation fault"...), if any."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Fatal Python error:"):
            return line.split(":", 1)[1].strip()
    return None
