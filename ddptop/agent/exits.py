"""How each rank's process ended, seen from outside by the node agent.

The ranks are torchrun's children, not ours, so ``waitpid`` is not ours to call. Instead:

* a *pidfd* (``os.pidfd_open``, Linux >= 5.3) of each rank becomes readable the moment the
  process exits, whoever its parent is;
* at that moment the process is a zombie until torchrun reaps it (torchrun polls every
  0.1 s), and a zombie's ``/proc/<pid>/stat`` carries its wait status (field 52,
  ``exit_code``, Linux >= 3.5): the exit code, or the signal that killed it.

If the parent reaps first (torchrun within its 0.1 s poll; slurmstepd under ``srun`` at once,
it waits on its tasks), Linux >= 6.15 still tells whoever holds a pidfd of the process: its
``PIDFD_GET_INFO`` ioctl returns the wait status of a reaped process (``PIDFD_INFO_EXIT``).
On older kernels the status is then unknown (``None``) and the rank's own last words
(exception, ``sys.exit``'s status, SIGTERM, faulthandler's fatal signal) have to tell.
Standard library only.
"""

from __future__ import annotations

import fcntl
import logging
import os
import selectors
import signal
import struct
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

STAT_EXIT_CODE_FIELD = 52  # 1-based field number in proc(5)
# linux/pidfd.h (6.15): struct pidfd_info, its first version (64 bytes): mask (u64), cgroupid
# (u64), eleven u32 ids, then exit_code (s32, a raw wait status). _IOWR(0xFF, 11, 64 bytes).
PIDFD_INFO_SIZE = 64
PIDFD_GET_INFO = (3 << 30) | (PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
PIDFD_INFO_EXIT = 1 << 3
PIDFD_EXIT_CODE_OFFSET = 60
# Between the parent's wait and the kernel's record of the exit, neither /proc (the task is
# no longer a zombie) nor the pidfd tells: a few short looks bridge that moment.
REAPED_LOOKS = 5
REAPED_LOOK_S = 0.002


@dataclass(frozen=True)
class ProcessExit:
    """One process's end: when, and its wait status decoded (both None when unknown)."""

    key: int  # the caller's key (a rank)
    pid: int
    time: float  # wall clock
    exit_code: int | None = None
    signal: str = ""

    @property
    def known(self) -> bool:
        """True if the exit code or the signal was read."""
        return self.exit_code is not None or bool(self.signal)


def decode_wait_status(status: int) -> tuple[int | None, str]:
    """(exit code, signal name) of a raw wait status as ``waitpid`` would return it."""
    if os.WIFSIGNALED(status):
        num = os.WTERMSIG(status)
        try:
            return None, signal.Signals(num).name
        except ValueError:
            return None, f"signal {num}"
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), ""
    return None, ""


def zombie_status(pid: int) -> int | None:
    """The raw wait status of *pid* if it is an unreaped zombie, else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ")".
    rest = text.rpartition(")")[2].split()
    if not rest or rest[0] != "Z":
        return None
    index = STAT_EXIT_CODE_FIELD - 3  # rest starts at field 3 (state)
    try:
        return int(rest[index])
    except (IndexError, ValueError):
        return None


def reaped_status(pidfd: int) -> int | None:
    """The raw wait status of the process behind *pidfd* once its parent reaped it (Linux >= 6.15,
    whoever holds the pidfd); None while it is not reaped, or where the kernel cannot tell."""
    info = bytearray(PIDFD_INFO_SIZE)
    struct.pack_into("=Q", info, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, info)
    except OSError:  # ENOTTY / EINVAL: an older kernel; ESRCH: not reaped and gone (cannot be)
        return None
    (mask,) = struct.unpack_from("=Q", info, 0)
    if not mask & PIDFD_INFO_EXIT:
        return None
    (status,) = struct.unpack_from("=i", info, PIDFD_EXIT_CODE_OFFSET)
    return int(status)


def ended_status(pid: int, pidfd: int) -> int | None:
    """The raw wait status of *pid*, which ended: from its zombie, else (its parent reaped it
    first) from its pidfd; None where neither tells."""
    for look in range(REAPED_LOOKS):
        status = zombie_status(pid)
        if status is None:
            status = reaped_status(pidfd)
        if status is not None:
            return status
        if look + 1 < REAPED_LOOKS:
            time.sleep(REAPED_LOOK_S)
    return None


class ExitWatcher:
    """Watches processes by pidfd; :meth:`poll` returns the ones that ended."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._watched: dict[int, tuple[int, int]] = {}  # pidfd -> (key, pid)
        self._gone: list[ProcessExit] = []

    def watch(self, key: int, pid: int) -> None:
        """Start watching *pid* under *key*; a process already gone is reported by the next poll."""
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError) as exc:
            # ESRCH: it is already gone (and reaped): nothing to read any more.
            log.debug("pidfd_open(%d) failed: %s", pid, exc)
            self._gone.append(ProcessExit(key=key, pid=pid, time=time.time()))
            return
        self._watched[fd] = (key, pid)
        self._sel.register(fd, selectors.EVENT_READ)

    @property
    def watching(self) -> int:
        """Processes still watched."""
        return len(self._watched)

    def poll(self, timeout: float) -> list[ProcessExit]:
        """Wait up to *timeout* for exits; return every exit seen (each once)."""
        out, self._gone = self._gone, []
        if not self._watched:
            if not out and timeout > 0:
                time.sleep(timeout)
            return out
        for key, _events in self._sel.select(0 if out else timeout):
            fd = int(key.fd)
            rank, pid = self._watched.pop(fd)
            status = ended_status(pid, fd)  # its zombie first: its parent may reap it any moment
            now = time.time()
            self._sel.unregister(fd)
            os.close(fd)
            code, sig = decode_wait_status(status) if status is not None else (None, "")
            out.append(ProcessExit(key=rank, pid=pid, time=now, exit_code=code, signal=sig))
        return out

    def close(self) -> None:
        """Stop watching everything."""
        for fd in list(self._watched):
            self._sel.unregister(fd)
            os.close(fd)
        self._watched.clear()
        self._sel.close()
