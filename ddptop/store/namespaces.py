"""Runtime directories this process cannot see in its own /tmp (#22).

A job whose /tmp is private to it (SLURM's ``job_container/tmpfs``, a container's own /tmp,
``PrivateTmp=`` of a systemd unit) writes its discovery entries where a person's SSH
session on the node never looks: the same path, another mount namespace. The kernel shows
that namespace's files at ``/proc/PID/root`` to whoever may read the process (its own user,
or root), without entering it and without touching the process: no signal, no ptrace stop,
only reads of ``/proc``.

:func:`hidden_runtime_dirs` walks ``/proc`` once (bounded), groups the processes that run
in another mount namespace by that namespace, and names the runtime directory each would
use (from its own ``DDPTOP_RUNTIME_DIR``, ``XDG_RUNTIME_DIR``, ``TMPDIR`` and user id, as
:func:`ddptop.store.discovery.runtime_dir` does) as seen through one of its processes. Records
there are alive when a process of that namespace has the record's pid in its own pid
namespace (a container's pids are not ours). A namespace whose network is not ours is kept
apart: its ranks' loopback ports cannot be reached from here, and the viewer says so.
Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ddptop.store.proc_start import start_ticks

PROC = Path("/proc")
MAX_PROCESSES = 65536  # /proc entries looked at, at most (a big node has a few thousand)
MAX_NAMESPACES = 256  # other mount namespaces looked into, at most
MAX_ENVIRON_BYTES = 256 * 1024  # a process's environment read, at most
MAX_ENVIRON_READS = 4096  # environments read in one walk, at most (a node full of pods)
_ENV_NAMES = (b"DDPTOP_RUNTIME_DIR", b"XDG_RUNTIME_DIR", b"TMPDIR")


@dataclass
class HiddenDir:
    """A runtime directory in another mount namespace, and how to reach and judge it."""

    path: Path  # as seen from here: /proc/PID/root/...
    inner: str  # as its processes see it
    pid: int  # the process through which it is seen (our pid namespace)
    same_network: bool  # its processes share our network namespace (loopback reaches them)
    pids: set[int] = field(default_factory=set)  # its processes' pids in their own pid namespace
    # Each of those pids' process start (ticks since boot; proc_start's reading), so that an
    # entry of a process that ended is not taken for the later one given its pid (#49).
    starts: dict[int, int] = field(default_factory=dict)

    def alive(self, pid: int, proc_start: int = 0) -> bool:
        """True if a process of this namespace has *pid* (as its discovery entries count pids)
        and, when the entry says when its process started (*proc_start*), started then."""
        if pid not in self.pids:
            return False
        now = self.starts.get(pid, 0)
        return not (proc_start and now and now != proc_start)


def _link(pid: str, name: str) -> str:
    try:
        return os.readlink(PROC / pid / "ns" / name)
    except OSError:
        return ""


def _inner_pid(pid: str) -> int:
    """The pid of /proc/*pid* in its own (innermost) pid namespace."""
    try:
        with open(PROC / pid / "status", "rb") as fh:
            for line in fh.read(8192).splitlines():
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return int(pid)


def _environ(pid: str) -> dict[bytes, bytes]:
    try:
        with open(PROC / pid / "environ", "rb") as fh:
            raw = fh.read(MAX_ENVIRON_BYTES)
    except OSError:
        return {}
    found: dict[bytes, bytes] = {}
    for entry in raw.split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name in _ENV_NAMES:
            found[name] = value
    return found


def runtime_dir_of(env: dict[bytes, bytes], uid: int) -> str:
    """The runtime directory a process with *env* and *uid* uses (discovery.runtime_dir's rule)."""
    if env.get(b"DDPTOP_RUNTIME_DIR"):
        return os.fsdecode(env[b"DDPTOP_RUNTIME_DIR"])
    if env.get(b"XDG_RUNTIME_DIR"):
        return os.path.join(os.fsdecode(env[b"XDG_RUNTIME_DIR"]), "ddptop")
    tmp = os.fsdecode(env.get(b"TMPDIR") or b"/tmp")
    return os.path.join(tmp, f"ddptop-{uid}")


def _same_dir(a: Path, b: Path | None) -> bool:
    if b is None:
        return False
    try:
        sa, sb = a.stat(), b.stat()
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def hidden_runtime_dirs(own: Path | None) -> list[HiddenDir]:
    """Runtime directories of processes in other mount namespaces that exist and that we
    may read, other than *own* (our runtime directory, which another namespace may share)."""
    me = str(os.getpid())
    own_mnt, own_net = _link(me, "mnt"), _link(me, "net")
    uid = os.getuid()
    by_ns: dict[str, list[tuple[str, int]]] = {}
    try:
        entries = os.scandir(PROC)
    except OSError:
        return []
    with entries:
        for count, entry in enumerate(entries):
            if count >= MAX_PROCESSES:
                break
            if not entry.name.isdigit():
                continue
            try:
                owner = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue
            if uid != 0 and owner != uid:
                continue  # another user's process: its root is not ours to read
            mnt = _link(entry.name, "mnt")
            if mnt and mnt != own_mnt and (mnt in by_ns or len(by_ns) < MAX_NAMESPACES):
                by_ns.setdefault(mnt, []).append((entry.name, owner))
    found: dict[tuple[str, str], HiddenDir] = {}
    reads = 0
    for processes in by_ns.values():
        inner_of = {pid: _inner_pid(pid) for pid, _ in processes}
        pids = set(inner_of.values())
        starts = {inner_of[pid]: start_ticks(pid) for pid, _ in processes}
        for pid, owner in processes:
            reads += 1
            if reads > MAX_ENVIRON_READS:
                break
            inner = runtime_dir_of(_environ(pid), owner)
            key = (processes[0][0], inner)
            if key in found or not os.path.isabs(inner):
                continue
            path = PROC / pid / "root" / inner.lstrip("/")
            try:
                if not path.is_dir() or _same_dir(path, own):
                    continue
            except OSError:
                continue
            found[key] = HiddenDir(path=path, inner=inner, pid=int(pid),
                                   same_network=_link(pid, "net") == own_net, pids=pids,
                                   starts=starts)
    return list(found.values())
