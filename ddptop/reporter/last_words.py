"""Last words on SIGTERM: what torchrun sends every surviving rank when one of them fails.

Python runs a signal handler only on the main thread, between bytecodes; a rank whose main
thread waits inside a collective (the common case at a teardown) would never run it, and
would then not die either. So the handler is not where the work happens:

* Python's C-level trampoline writes the signal number into the *wakeup fd*
  (``signal.set_wakeup_fd``) without the GIL; a small daemon thread reads it, writes the
  last words (a fresh sample and a fresh Flight Recorder read, bounded in time), then
  restores the default disposition and re-raises SIGTERM, so the rank dies of SIGTERM as
  it would have without ddptop.
* that thread first writes every thread's stack into the crash file
  (``faulthandler.dump_traceback`` with the GIL held). Not from the signal handler: there
  faulthandler walks the frames of threads that run Python at that moment, without the GIL,
  and a rank with busy threads then died of SIGSEGV instead of SIGTERM (1 in 30 to 1 in 4
  SIGTERMs with three busy threads, measured: tests/test_sigterm_words.py; seen first under
  SLURM, whose step signal and torchrun's own SIGTERM come together). A rank wedged in C
  holding the GIL runs no Python and so writes no last words: the node agent reads its
  stack from outside while it is silent (:mod:`ddptop.agent.outside`), and torchrun's
  SIGKILL ends it.
* If the program installs its own SIGTERM handler later (Lightning does, for SLURM), ddptop
  still writes its last words but leaves the exit to the program's handler.

Nothing here is installed unless it can be done safely: only from the main thread, only
when no wakeup fd is in use, never in forked children (they get the default back).
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import IO, Any

log = logging.getLogger(__name__)

TERM = signal.SIGTERM
# The last words may take this long before the rank is let go; torchrun waits 30 s between
# its SIGTERM and a SIGKILL, so this is well inside what a rank is given anyway.
DEADLINE_S = 2.0


class SigtermWatch:
    """Runs *on_term* (bounded) when the process gets SIGTERM, then lets it die of it."""

    def __init__(self, on_term: Callable[[], None], crash_file: IO[str] | None,
                 deadline_s: float = DEADLINE_S) -> None:
        self._on_term = on_term
        self._crash_file = crash_file
        self._deadline_s = deadline_s
        self._once = threading.Lock()
        self._pipe: tuple[int, int] | None = None
        self.installed = False

    def install(self) -> bool:
        """Install the handler, the wakeup fd and the reader thread; False if it is not safe."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(TERM) not in (signal.SIG_DFL, None):
            return False  # the program (or a launcher) already handles SIGTERM: leave it alone
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return False
        if previous != -1:  # someone else (asyncio) owns the wakeup fd: give it back
            signal.set_wakeup_fd(previous)
            os.close(r)
            os.close(w)
            return False
        self._pipe = (r, w)
        signal.signal(TERM, self._handler)
        threading.Thread(target=self._read, name="ddptop-sigterm", daemon=True).start()
        os.register_at_fork(after_in_child=self._forget_in_child)
        self.installed = True
        return True

    def _forget_in_child(self) -> None:
        # A forked child (a DataLoader worker) shares the pipe: its SIGTERM must not kill the
        # rank through our thread, and the child has no such thread anyway.
        try:
            if self._pipe is not None:
                signal.set_wakeup_fd(-1)
                for fd in self._pipe:
                    os.close(fd)
                self._pipe = None
            if signal.getsignal(TERM) == self._handler:
                signal.signal(TERM, signal.SIG_DFL)
        except Exception:
            pass

    def _handler(self, signum: int, frame: Any) -> None:
        # Runs on the main thread if it reaches a bytecode before the reader thread is done.
        self._last_words_then_die()

    def _read(self) -> None:
        assert self._pipe is not None
        fd = self._pipe[0]
        while True:
            try:
                data = os.read(fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return
            if TERM in data:
                self._last_words_then_die()

    def _last_words_then_die(self) -> None:
        if not self._once.acquire(blocking=False):
            return  # the other path is already at it (or done)
        if self._crash_file is not None:
            try:  # every thread's stack, with the GIL held: no frame changes under the walk
                faulthandler.dump_traceback(file=self._crash_file, all_threads=True)
                self._crash_file.flush()
            except (ValueError, RuntimeError, OSError):
                pass
        # Even a hung last word must not keep the rank alive past the deadline.
        watchdog = threading.Timer(self._deadline_s, self._die)
        watchdog.daemon = True
        watchdog.start()
        began = time.monotonic()
        try:
            self._on_term()
        except Exception as exc:
            log.debug("ddptop: last words on SIGTERM failed: %s", exc)
        log.debug("ddptop: last words took %.3f s", time.monotonic() - began)
        watchdog.cancel()
        if signal.getsignal(TERM) == self._handler:
            self._die()
        # else: the program installed its own handler; it decides when to exit.

    def _die(self) -> None:
        """Restore the default action and re-raise SIGTERM: the rank ends as it would have."""
        _reset_default(TERM)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [TERM])
        os.kill(os.getpid(), TERM)


def _reset_default(signum: int) -> None:
    # signal.signal() may only be called from the main thread; libc's signal() from any.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signum, 0)  # SIG_DFL is 0
