"""Crash capture: native stacks on fatal signals, and a rank's last words at exit.

``faulthandler`` writes every thread's stack into a per-rank file when the rank dies of
SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL, and on SIGUSR2 on demand (it works even
while a C call holds the GIL). At interpreter exit the reporter writes a last-words file
(final state and the exception, if one killed the rank) for viewers to read post-mortem.

A ``SystemExit`` is no such exception: Python exits with its status without calling
``sys.excepthook`` or keeping it in ``sys.last_value``, so at exit nothing tells a
``sys.exit("bad shard 7")`` (status 1) from the end of the script. ``sys.exit`` is
therefore wrapped: called on the main thread, it notes the status and message it exits
with (:class:`ExitRequest`) for the last words. A bare ``raise SystemExit(...)`` passes
no function of ours: only its exit status is known then, read by the node agent.

Forked children (DataLoader workers) inherit faulthandler and its file descriptor: a
worker's segfault would land in the rank's crash file and read as the rank's own. After a
fork the child therefore writes into a file of its own, ``<job>.<rank>.w<pid>.crash``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NoReturn

from ddptop.errortext import innermost
from ddptop.store import remains

DUMP_SIGNAL = signal.SIGUSR2


@dataclass(frozen=True)
class ExitRequest:
    """What the main thread passed to ``sys.exit``: the process's exit status and, for a
    message (Python prints it and exits 1), the exception as ``repr`` shows it, with where
    ``sys.exit`` was called on a second line."""

    status: int
    reason: str = ""


def exit_request(code: object, where: str = "") -> ExitRequest:
    """The exit ``sys.exit(code)`` makes, as Python makes it: None is 0, an int its low
    eight bits (what the parent's wait sees), anything else is printed and exits 1."""
    if code is None:
        return ExitRequest(0)
    if isinstance(code, int):
        return ExitRequest(code & 0xFF, f"{SystemExit(code)!r}\n  {where}" if code & 0xFF and where else "")
    return ExitRequest(1, f"{SystemExit(code)!r}" + (f"\n  {where}" if where else ""))


class CrashCapture:
    """Owns the crash file and remembers an unhandled exception for the last words."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self.exit_reason = ""
        self.exit_request: ExitRequest | None = None  # the main thread's sys.exit, if it called it
        self._previous_hook: Any = None

    def enable(self) -> bool:
        """Route fatal-signal dumps into the crash file; False if the user already did."""
        if faulthandler.is_enabled():
            return False  # the user configured faulthandler: leave theirs alone
        self._file = _open_private(self.path)
        self._file.write(f"# ddptop crash file for pid {os.getpid()}\n")
        faulthandler.enable(file=self._file, all_threads=True)
        try:
            faulthandler.register(DUMP_SIGNAL, file=self._file, all_threads=True, chain=False)
        except (AttributeError, ValueError, RuntimeError):
            pass
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        os.register_at_fork(after_in_child=self._own_file_in_child)
        return True

    @property
    def file(self) -> IO[str] | None:
        """The open crash file (faulthandler writes into it), if enabled."""
        return self._file

    def watch_exit(self) -> None:
        """Wrap ``sys.exit``: the main thread's call notes its status and message first."""
        original = sys.exit
        if getattr(original, "_ddptop", False):
            return
        capture = self

        def exit(*args: object, **kwargs: object) -> NoReturn:
            if not kwargs and len(args) <= 1 and threading.current_thread() is threading.main_thread():
                try:
                    code = sys._getframe(1).f_code
                    where = f"sys.exit at {code.co_filename}:{sys._getframe(1).f_lineno} in {code.co_name}"
                    capture.exit_request = exit_request(args[0] if args else None, where)
                except Exception:
                    pass  # never in the way of the exit
            original(*args, **kwargs)  # type: ignore[arg-type]
            raise AssertionError("sys.exit returned")  # unreachable: it raises SystemExit

        exit.__doc__, exit.__qualname__ = original.__doc__, original.__qualname__
        exit._ddptop = True  # type: ignore[attr-defined]
        sys.exit = exit

    def _own_file_in_child(self) -> None:
        try:
            path = worker_crash_path(self.path, os.getpid())
            self._file = _open_private(path)
            self._file.write(f"# ddptop crash file for pid {os.getpid()}, forked from pid {os.getppid()}\n")
            faulthandler.disable()  # enable() while enabled keeps the old file: start over
            faulthandler.enable(file=self._file, all_threads=True)
            self.path = path
        except Exception:
            faulthandler.disable()  # never write a child's crash into the rank's file

    def keep_faulthandler_in_workers(self) -> None:
        """Re-enable faulthandler after torch sets up a DataLoader worker's signals.

        torch installs its own SIGSEGV/SIGBUS/SIGFPE handler in every worker (it prints
        "Unexpected segmentation fault encountered in worker" and dies), replacing
        faulthandler's, so a worker's crash would leave no stack. faulthandler put back on
        top dumps the stack into the worker's file, then calls torch's handler as before.
        """
        try:
            from torch.utils.data._utils import signal_handling
        except ImportError:
            return
        original = signal_handling._set_worker_signal_handlers
        if getattr(original, "_ddptop", False):
            return
        capture = self

        def set_worker_signal_handlers(*args: Any, **kwargs: Any) -> Any:
            if capture._file is None:
                return original(*args, **kwargs)
            # faulthandler must be off while torch installs its handlers (enable() is a no-op
            # while enabled, and disable() restores what was there before it): then on top.
            faulthandler.disable()
            result = original(*args, **kwargs)
            faulthandler.enable(file=capture._file, all_threads=True)
            return result

        set_worker_signal_handlers._ddptop = True  # type: ignore[attr-defined]
        signal_handling._set_worker_signal_handlers = set_worker_signal_handlers

    def exception_reason(self) -> str:
        """Why the main thread died of an exception ("" if it did not), even if the program
        replaced ``sys.excepthook`` after ddptop: Python keeps the exception in
        ``sys.last_value`` before it calls whatever hook is installed."""
        if self.exit_reason:
            return self.exit_reason
        value = getattr(sys, "last_value", None)
        if isinstance(value, BaseException) and not isinstance(value, SystemExit | KeyboardInterrupt):
            return describe_exception(type(value), value, value.__traceback__)
        return ""

    def _excepthook(self, etype: type[BaseException], value: BaseException,
                    tb: TracebackType | None) -> None:
        self.exit_reason = describe_exception(etype, value, tb)
        previous = self._previous_hook or sys.__excepthook__
        previous(etype, value, tb)

    def crashed(self) -> bool:
        """True if the crash file holds a fatal-signal dump (read by viewers too)."""
        return crash_signal(self.path) is not None


def describe_exception(etype: type[BaseException], value: BaseException,
                       tb: TracebackType | None) -> str:
    """The exception and its innermost frames (bounded). Where it wraps another error (a
    DataLoader worker's "Caught X in DataLoader worker process N", spawn's
    ProcessRaisedException, a chain of causes), its first line is the innermost cause
    ("OSError: ... (raised as RuntimeError: Caught ...)"): the cap never cuts the cause off."""
    try:
        frames = traceback.extract_tb(tb)[-3:]
        where = "; ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in frames)
        told = f"{etype.__name__}: {value} ({where})"
        cause = innermost(_chain_text(value))
        if cause.wrapper:
            told = f"{cause.text(600)}\n{told}"
        return told[:2000]
    except Exception:
        return etype.__name__


MAX_CHAIN = 16


def _chain_text(value: BaseException) -> str:
    """The exception and those it was raised from, innermost first, as Python prints a chain."""
    chain: list[BaseException] = [value]
    while len(chain) < MAX_CHAIN:
        e = chain[-1]
        inner = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
        if inner is None or inner in chain:
            break
        chain.append(inner)
    marker = "\nThe above exception was the direct cause of the following exception:\n"
    return marker.join(f"{type(e).__name__}: {str(e)[:4000]}" for e in reversed(chain))


def worker_crash_path(rank_crash: Path, pid: int) -> Path:
    """Crash file of a process forked from the rank whose crash file is *rank_crash*."""
    return rank_crash.with_name(f"{rank_crash.stem}.w{pid}.crash")


def _open_private(path: Path) -> IO[str]:
    # 0600, and never through a symlink someone planted in the runtime directory.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "w", buffering=1)


def crash_signal(path: Path) -> str | None:
    """The fatal error faulthandler recorded in *path* ("Segmentation fault"...), if any."""
    return remains.crash_signal(path)
