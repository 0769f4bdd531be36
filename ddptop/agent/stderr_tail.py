"""The job's stderr, passed through unchanged and its tail kept in the job's record directory.

What the ranks and torchrun say on stderr is often the cause itself: a C++ ``terminate
called ... what():`` line that no rank prefixes, gloo's "1092 vs 4", NCCL's watchdog,
torchrun's failure summary. ``ddptop launch`` gives the job a stderr of its own, copies
every byte to its own stderr at once, and keeps the last ``cap`` bytes in the record directory
(``console.log`` and, before it, ``console.log.1``), where ``ddptop doctor JOB`` reads them
with the torchrun-log reader. Where ddptop's stderr is a terminal the job gets a
pseudo-terminal, so it still sees a terminal (colours, progress bars); else a pipe, as it
had before. The copy never waits on the disk: a write that fails stops the tail, not
the job. What is kept is masked like every other file ddptop writes (secret-looking values,
credentials in URLs, the values of secret-named variables); what is passed through is not.
"""

from __future__ import annotations

import logging
import os
import pty
import threading
from pathlib import Path

from ddptop.secrets_filter import MASK, is_secret_name, mask_value

log = logging.getLogger(__name__)

CONSOLE_FILE = "console.log"
DEFAULT_CAP_BYTES = 8 << 20  # both halves together
READ_CHUNK = 64 * 1024
MAX_PARTIAL = 64 * 1024  # a line longer than this is masked and kept in pieces


class StderrTail:
    """A stderr for the job whose bytes go to ours and, capped, into *directory*."""

    def __init__(self, directory: Path, cap_bytes: int = DEFAULT_CAP_BYTES, target_fd: int = 2) -> None:
        self._target = target_fd
        self._half = max(4096, cap_bytes // 2)
        self._path = directory / CONSOLE_FILE
        if os.isatty(target_fd):
            self._read_fd, self.child_fd = pty.openpty()
        else:
            self._read_fd, self.child_fd = os.pipe()
        self._file: int | None = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                                         | os.O_APPEND, 0o600)
        self._written = 0
        self._partial = b""
        # Values of secret-named variables, masked wherever they appear (an echoed config).
        self._secrets = sorted({v for k, v in os.environ.items() if is_secret_name(k) and len(v) >= 6},
                               key=len, reverse=True)
        self._thread = threading.Thread(target=self._copy, name="ddptop-stderr", daemon=True)

    def start(self) -> None:
        """Begin copying (call once the child has its end, then :meth:`child_started`)."""
        self._thread.start()

    def child_started(self) -> None:
        """The child holds its end: close ours, so the copy ends when the job's last writer does."""
        os.close(self.child_fd)

    def join(self, timeout: float) -> None:
        """Wait (bounded) for the job's last bytes to be copied."""
        self._thread.join(timeout)

    def _copy(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self._read_fd, READ_CHUNK)
                except OSError:  # a pty reads EIO once the last writer closed it
                    break
                if not data:
                    break
                _write_all(self._target, data)
                self._keep(data)
        finally:
            self._keep(b"", final=True)
            os.close(self._read_fd)
            if self._file is not None:
                os.close(self._file)
                self._file = None

    def _keep(self, data: bytes, final: bool = False) -> None:
        """Mask secrets line by line (a line cut between two reads waits for its end), then keep."""
        buf = self._partial + data
        cut = len(buf) if final or len(buf) > MAX_PARTIAL else buf.rfind(b"\n") + 1
        self._partial = buf[cut:]
        if cut:
            self._store(_masked(buf[:cut], self._secrets))

    def _store(self, data: bytes) -> None:
        if self._file is None:
            return
        try:
            if self._written + len(data) > self._half:
                os.close(self._file)
                os.replace(self._path, self._path.with_name(CONSOLE_FILE + ".1"))
                self._file = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                                     | os.O_APPEND, 0o600)
                self._written = 0
            self._written += os.write(self._file, data[-self._half:])
        except OSError as exc:  # the disk is full, the record directory was removed: the job goes on
            log.debug("ddptop: stderr tail stopped: %s", exc)
            if self._file is not None:
                os.close(self._file)
            self._file = None


def _masked(data: bytes, secrets: list[str]) -> bytes:
    """*data* with what looks like a secret masked, as everywhere else ddptop writes a file."""
    text = mask_value(data.decode("utf-8", "replace"))
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text.encode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
        except OSError:
            return  # our stderr is gone (closed terminal): the tail still gets the bytes
