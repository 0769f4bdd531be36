"""The test session's own runtime directories, and the watch that keeps the machine's out of it (#49).

A machine that ran ddptop jobs before keeps their discovery entries in its default runtime
directory (``/tmp/ddptop-UID``, or ``$XDG_RUNTIME_DIR/ddptop``); a test that read it saw an
ended job's ranks instead of its own live ones. So the session gives every process it starts
two directories of its own, through the environment they inherit:

* ``DDPTOP_RUNTIME_DIR``: where tests' ranks and viewers meet (a test narrows it further with
  the ``runtime_dir``/``job_runner`` fixtures);
* ``XDG_RUNTIME_DIR``: a trap. A process that drops ``DDPTOP_RUNTIME_DIR`` (a test that
  stands for a person's shell, a job under SLURM) falls back to ``$XDG_RUNTIME_DIR/ddptop``,
  which only this session's processes can name. The trap is made up front and watched with
  inotify: any open of it or of a file in it, or anything created there, is a test that read
  or wrote "the machine's default directory", and fails the session, naming the files.

The machine's own default directory is watched as well, for new files only: a live process of
this session that wrote one there (one that named the directory itself) fails the session
too; any other new file there is reported as a warning, since inotify does not say who wrote
it and a job run beside the suite may.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SESSION_ENV = "DDPTOP_TESTS_SESSION_DIR"  # set once by the controller; workers and children inherit it

IN_ACCESS = 0x001
IN_MODIFY = 0x002
IN_OPEN = 0x020
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")
_NAMES = {IN_ACCESS: "read", IN_MODIFY: "written", IN_OPEN: "opened", IN_MOVED_TO: "moved in",
          IN_CREATE: "created"}


def machine_default_dir(env: dict[str, str] | None = None) -> Path:
    """The runtime directory a ddptop process with the environment *env* (the session's own
    before it changed anything) uses when nobody names one: discovery.runtime_dir's rule."""
    env = dict(os.environ if env is None else env)
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "ddptop"
    return Path(tempfile.gettempdir()) / f"ddptop-{os.getuid()}"


class Watch:
    """inotify on one directory: what was opened, read, written or created in it."""

    def __init__(self, path: Path, mask: int) -> None:
        self.path = path
        self.fd = -1
        libc_name = ctypes.util.find_library("c")
        if libc_name is None:
            return
        libc = ctypes.CDLL(libc_name, use_errno=True)
        fd = libc.inotify_init1(IN_NONBLOCK)
        if fd < 0:
            return
        if libc.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
            os.close(fd)
            return
        self.fd = fd

    @property
    def watching(self) -> bool:
        return self.fd >= 0

    def events(self) -> list[str]:
        """'NAME opened' (the directory itself as '.') for every event so far; drains them."""
        out: list[str] = []
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 64 * 1024)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                raise
            offset = 0
            while offset + _EVENT.size <= len(data):
                _wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                raw = data[offset + _EVENT.size:offset + _EVENT.size + size]
                name = raw.rstrip(b"\0").decode(errors="replace") or "."
                offset += _EVENT.size + size
                kinds = [word for bit, word in _NAMES.items() if mask & bit]
                out.extend(f"{name} {kind}" for kind in kinds)
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class SessionDirs:
    """The session's runtime directory and trap, and the watches over the trap and the machine's."""

    root: Path
    machine_default: Path
    trap: Watch | None = None
    machine: Watch | None = None
    made_default: bool = False
    before: set[str] = field(default_factory=set)

    @property
    def runtime(self) -> Path:
        return self.root / "rt"

    @property
    def trap_dir(self) -> Path:
        return self.root / "xdg" / "ddptop"

    @staticmethod
    def start() -> SessionDirs:
        """Make the directories, point this process's environment at them, start watching."""
        default = machine_default_dir()
        root = Path(tempfile.mkdtemp(prefix="ddptop-tests-"))
        dirs = SessionDirs(root=root, machine_default=default)
        for path in (dirs.runtime, dirs.trap_dir):
            path.mkdir(mode=0o700, parents=True)
        os.chmod(root / "xdg", 0o700)
        os.environ[SESSION_ENV] = str(root)
        os.environ["DDPTOP_RUNTIME_DIR"] = str(dirs.runtime)
        os.environ["XDG_RUNTIME_DIR"] = str(root / "xdg")
        dirs.trap = Watch(dirs.trap_dir, IN_OPEN | IN_ACCESS | IN_CREATE | IN_MOVED_TO | IN_MODIFY)
        if default.is_dir():
            dirs.before = {p.name for p in default.iterdir()}
            dirs.machine = Watch(default, IN_CREATE | IN_MOVED_TO)
        return dirs

    def finish(self) -> tuple[list[str], list[str]]:
        """(failures, warnings): what this session's processes did in the trap (read or wrote
        "the default directory"), and new files in the machine's default directory (a failure
        where a process of this session wrote them, else a warning: a job run beside the suite)."""
        failures = [f"{self.trap_dir}/{e}" for e in (self.trap.events() if self.trap else [])]
        failures += [f"{p} left behind" for p in self.trap_dir.iterdir()]
        warnings: list[str] = []
        if self.machine is not None:
            for event in sorted(set(self.machine.events())):
                name = event.rsplit(" ", 1)[0]
                if name.startswith(".") or name in self.before:
                    continue  # private_write's temporary files, and what was there before
                (failures if _ours(self.machine_default / name, self.root) else warnings).append(
                    f"{self.machine_default}/{event}")
        for watch in (self.trap, self.machine):
            if watch is not None:
                watch.close()
        shutil.rmtree(self.root, ignore_errors=True)
        return failures, warnings


def _ours(path: Path, root: Path) -> bool:
    """True when the discovery entry at *path* was written by a live process of this session
    (its environment names the session's directory). A file that cannot be told so is not
    counted against the session: inotify does not say who wrote it."""
    try:
        pid = int(json.loads(path.read_bytes()[:65536])["pid"])
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return f"{SESSION_ENV}={root}".encode() in environ.split(b"\0")
