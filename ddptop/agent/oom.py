"""The kernel's word on a rank killed by SIGKILL: was it the OOM killer?

A SIGKILL from outside could be the OOM killer, the scheduler or a person; the kernel
knows which. The node agent notes each rank's memory cgroup and its OOM-kill counter while
the rank lives (``/proc/PID/cgroup``; cgroup v1 ``memory.oom_control`` ``oom_kill``, v2
``memory.events`` ``oom_kill``; again every few seconds: a process can be moved into another
cgroup after it started), and when the rank dies of SIGKILL reads the counter again;
where it did not move (a machine-wide OOM, or no memory cgroup), ``/dev/kmsg`` is searched
for the kernel's "Killed process PID" line, where it is readable. Standard library only;
every read is small, bounded and degrades to "unknown".
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOTS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
UNLIMITED = 1 << 60  # v1 reports "no limit" as a page-rounded LONG_MAX
MAX_KMSG_RECORDS = 20_000
OOM_KILL = "oom_kill"
_KILLED = re.compile(rb"Killed process (\d+)")


@dataclass(frozen=True)
class MemoryCgroup:
    """A process's memory cgroup directory and its version."""

    path: Path
    v2: bool

    @classmethod
    def of(cls, pid: int) -> MemoryCgroup | None:
        """The memory cgroup of a living *pid*, or None where it cannot be told."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:  # v1: "7:memory:/path"; v2: "0::/path"
            _, controllers, rel = [*line.split(":", 2), "", ""][:3]
            v2 = controllers == ""
            if not v2 and "memory" not in controllers.split(","):
                continue
            for root in (CGROUP_ROOTS[1:] if v2 else CGROUP_ROOTS[:1]):
                path = root / rel.lstrip("/")
                if (path / ("memory.events" if v2 else "memory.oom_control")).is_file():
                    return cls(path, v2)
        return None

    def oom_kills(self) -> int | None:
        """The cgroup's count of OOM kills so far."""
        for line in _read(self.path / ("memory.events" if self.v2 else "memory.oom_control")).splitlines():
            key, _, value = line.partition(" ")
            if key == OOM_KILL and value.strip().isdigit():
                return int(value)
        return None

    def limit(self) -> int | None:
        """The memory limit in bytes, None where there is none."""
        text = _read(self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).strip()
        return int(text) if text.isdigit() and int(text) < UNLIMITED else None

    def peak(self) -> int | None:
        """The most memory the cgroup used, in bytes (v1 max usage, v2 memory.peak)."""
        text = _read(self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")).strip()
        return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class OomVerdict:
    """What the kernel says of one SIGKILL."""

    cause: str = ""  # "oom_kill", or "" where nothing says so
    limit_bytes: int | None = None
    peak_bytes: int | None = None


class MemoryWatch:
    """Each watched rank's memory cgroup, and each cgroup's OOM kills not yet put to a rank."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, MemoryCgroup | None]] = {}  # rank -> pid, cgroup
        # cgroup -> kills already accounted for: ranks share a cgroup, and one OOM kill must
        # not make every rank SIGKILLed afterwards (torchrun's teardown) an OOM victim too.
        self._accounted: dict[Path, int] = {}

    def watch(self, rank: int, pid: int, cgroup: MemoryCgroup | None = None) -> None:
        """Note *rank*'s cgroup (read from /proc unless given) and the cgroup's count so far."""
        cgroup = cgroup if cgroup is not None else MemoryCgroup.of(pid)
        self._seen[rank] = (pid, cgroup)
        if cgroup is not None and cgroup.path not in self._accounted:
            self._accounted[cgroup.path] = cgroup.oom_kills() or 0

    def follow(self, rank: int, pid: int) -> None:
        """Note *rank*'s cgroup again where its process was moved into another since (cgclassify,
        a scheduler's late placement: #55); the new cgroup's kills so far are not its."""
        seen_pid, before = self._seen.get(rank, (pid, None))
        if seen_pid != pid:
            return
        now = MemoryCgroup.of(pid)
        if now is not None and now != before:
            self.watch(rank, pid, now)

    def verdict(self, rank: int, pid: int, signal: str) -> OomVerdict:
        """Whether the OOM killer ended *rank* (only asked of a SIGKILL)."""
        if signal != "SIGKILL":
            return OomVerdict()
        seen_pid, cgroup = self._seen.get(rank, (pid, None))
        if seen_pid != pid:
            cgroup = None
        limit = cgroup.limit() if cgroup is not None else None
        peak = cgroup.peak() if cgroup is not None else None
        if pid in killed_by_kernel():  # the kernel names this very pid
            if cgroup is not None:
                self._accounted[cgroup.path] = max(self._accounted.get(cgroup.path, 0),
                                                   (cgroup.oom_kills() or 0))
            return OomVerdict(OOM_KILL, limit, peak)
        after = cgroup.oom_kills() if cgroup is not None else None
        if cgroup is not None and after is not None and after > self._accounted.get(cgroup.path, after):
            self._accounted[cgroup.path] += 1  # this kill is this rank's; the next SIGKILL needs its own
            return OomVerdict(OOM_KILL, limit, peak)
        return OomVerdict("", limit, peak)


def killed_by_kernel(path: str = "/dev/kmsg") -> set[int]:
    """Pids the kernel log says the OOM killer killed (empty where the log is not readable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return set()
    out: set[int] = set()
    try:
        for _ in range(MAX_KMSG_RECORDS):
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while reading: go on
                    continue
                break  # EAGAIN: the end of the log
            if not record:
                break
            found = _KILLED.search(record)
            if found:
                out.add(int(found.group(1)))
    finally:
        os.close(fd)
    return out


def _read(path: Path) -> str:
    try:
        with open(path) as fh:
            return fh.read(4096)
    except OSError:
        return ""
