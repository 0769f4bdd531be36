"""The limits a rank can run into, and its use of them: memory cgroup, host memory, checkpoint disk.

What the viewers' trends (``ddptop.diagnosis.rules_resources``) are judged against. Cheap by
design, on the reporter thread only:

* the memory cgroup (``/proc/self/cgroup``; v2 ``memory.current`` / ``memory.max``, v1
  ``memory.usage_in_bytes`` / ``memory.limit_in_bytes``), walking up to the ancestor whose
  limit is the tightest (a container's limit sits on a parent of the rank's own cgroup); its
  use is one ``pread`` of a file kept open (a few microseconds), less its inactive file cache
  (``memory.stat``: reclaimed before any OOM kill); where the rank sits, the limit and the
  cache re-read every :data:`SLOW_EVERY_S` (a process can be moved into another cgroup after
  it started: ``cgclassify``, a scheduler's late placement, #55);
* the checkpoint directory comes from ``DDPTOP_CHECKPOINT_DIR`` (``ddptop launch
  --checkpoint-dir``), else from the rank's own ``torch.save`` to a path (noted by the
  patched ``torch.save``, :mod:`ddptop.reporter.progress`); its filesystem is read with one
  ``statvfs`` every :data:`SLOW_EVERY_S`, and at the first sample after each ``torch.save``
  returns; each move of its use by ``DISK_STEP_BYTES`` or more is kept
  (``RankState.disk_levels``): growth in steps is forecast from those.

Nothing here raises: a file that cannot be read leaves its field ``None``. Standard library only.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ddptop.rank_state import RankState, kept_levels

CGROUP_MOUNT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60  # v1 reports "no limit" as a page-rounded LONG_MAX; v2 says "max"
SLOW_EVERY_S = 5.0  # limits and statvfs: they move slowly, and a network filesystem can be slow


class SaveCount:
    """How many ``torch.save`` calls to a path have started, and returned (or raised): bumped by
    the patched ``torch.save`` on the training thread, read by the reporter thread (counters only).
    A read while one is being written is not kept as a level: half a save is not a step."""

    __slots__ = ("path", "returned", "started", "started_at")

    def __init__(self) -> None:
        self.started = 0
        self.returned = 0
        self.path = ""  # the newest save's file
        self.started_at = 0.0  # and when it began (wall clock)


SAVES = SaveCount()


@dataclass(frozen=True, slots=True)
class CgroupFiles:
    """The use and limit files of one memory cgroup, and its path (what ranks sharing it share)."""

    path: str  # as /proc/self/cgroup names it, e.g. /kubepods/pod1/ctr or /job.slice
    usage: Path
    limit: Path
    stat: Path  # memory.stat: its inactive file cache is what the kernel reclaims before any OOM kill
    inactive_key: str  # that cache's line in it (v1 counts the cgroup's children too: total_...)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, ValueError):
        return None
    return int(text) if text.isdigit() and int(text) < UNLIMITED else None


def cgroup_levels(proc_cgroup: str, mount: Path = CGROUP_MOUNT) -> list[CgroupFiles]:
    """The memory cgroup of the process and its ancestors, innermost first (empty: none readable)."""
    out: list[CgroupFiles] = []
    for line in proc_cgroup.splitlines():  # v1: "4:memory:/path"; v2: "0::/path"
        _, controllers, rel = [*line.split(":", 2), "", ""][:3]
        v2 = controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        root = mount if v2 else mount / "memory"
        usage, limit = ("memory.current", "memory.max") if v2 else ("memory.usage_in_bytes",
                                                                   "memory.limit_in_bytes")
        inactive = "inactive_file" if v2 else "total_inactive_file"
        if v2 and not (root / "cgroup.controllers").is_file():
            root = mount / "unified"  # a hybrid machine: v2 beside the v1 controllers
        parts = [p for p in rel.strip().split("/") if p]
        for depth in range(len(parts), -1, -1):
            where = root.joinpath(*parts[:depth])
            if (where / usage).is_file():
                out.append(CgroupFiles("/" + "/".join(parts[:depth]), where / usage, where / limit,
                                       where / "memory.stat", inactive))
        if out:
            return out
    return out


def inactive_file(level: CgroupFiles) -> int:
    """The cgroup's inactive file cache in bytes (0 where unknown): reclaimed before any OOM kill,
    so left out of its use, as ``docker stats`` does (a job that writes files fills the cache)."""
    key = level.inactive_key
    try:
        text = level.stat.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def tightest(levels: list[CgroupFiles]) -> tuple[CgroupFiles | None, int | None]:
    """The level whose limit binds (the lowest), with that limit; the innermost one without any."""
    best: tuple[CgroupFiles | None, int | None] = (levels[0] if levels else None, None)
    for level in levels:
        limit = _read_int(level.limit)
        if limit is not None and (best[1] is None or limit < best[1]):
            best = (level, limit)
    return best


@dataclass(slots=True)
class DiskUse:
    """One statvfs of the checkpoint directory's filesystem."""

    mount: str
    used: int
    total: int  # used + what the rank may still write (root's reserve left out)


def disk_use(directory: str) -> DiskUse | None:
    """The filesystem of *directory* (its nearest existing ancestor), or None."""
    path = Path(directory).expanduser()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    mount = path.resolve()
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return DiskUse(str(mount), used, used + st.f_bavail * st.f_frsize)


def _before_first_save(disk: DiskUse) -> list[tuple[float, int]]:
    """The level before the save that made a directory known (read once it returned): the use
    less the file it wrote, when it began; [] where that file is not on *disk* (or gone)."""
    if not SAVES.path or not SAVES.path.startswith(disk.mount):
        return []
    try:
        size = os.stat(SAVES.path).st_blocks * 512  # what it takes of the filesystem
    except OSError:
        return []
    return [(SAVES.started_at, disk.used - size)] if disk.used - size >= 0 else []


class ResourceReader:
    """Reads the rank's memory cgroup and checkpoint filesystem; keeps the last values."""

    def __init__(self, checkpoint_dir: str = "") -> None:
        self.checkpoint_dir = checkpoint_dir  # the option's; else torch.save's, once seen
        self.saved_to = ""  # set by the patched torch.save (the training thread): a directory
        self._levels: list[CgroupFiles] | None = None
        self._cgroup: CgroupFiles | None = None
        self._fd: int | None = None
        self.cgroup_limit: int | None = None
        self._inactive = 0  # the cgroup's inactive file cache at the last slow read
        self.disk: DiskUse | None = None
        self.disk_levels: list[tuple[float, int]] = []  # replaced, never mutated (states share it)
        self._levels_mount = ""  # the filesystem they are of
        self._saves_seen = 0
        self._proc_cgroup: str | None = None  # /proc/self/cgroup as last read
        self._slow_due = 0.0

    def cgroup_usage(self) -> int | None:
        """The binding cgroup's use now: one pread of its file, kept open."""
        if self._fd is None:
            return None
        try:
            text = os.pread(self._fd, 32, 0).strip()
        except OSError:
            return None
        return max(0, int(text) - self._inactive) if text.isdigit() else None

    def refresh(self, now: float | None = None, force: bool = False) -> bool:
        """The slow reads, when due (every SLOW_EVERY_S) or *force*d: the cgroup's limit, the disk.
        True if done."""
        now = time.monotonic() if now is None else now
        if now < self._slow_due and not force:
            return False
        self._slow_due = now + SLOW_EVERY_S
        try:
            text = Path("/proc/self/cgroup").read_text()
        except OSError:
            text = ""
        if text != self._proc_cgroup or self._levels is None:  # moved: the new place's limits bind
            self._proc_cgroup = text
            self._levels = cgroup_levels(text) if text else []
        level, self.cgroup_limit = tightest(self._levels)
        if level != self._cgroup:
            self._reopen(level)
        self._inactive = inactive_file(level) if level is not None else 0
        self._read_disk()
        return True

    def _read_disk(self) -> None:
        directory = self.checkpoint_dir or self.saved_to
        disk = disk_use(directory) if directory else None
        self.disk = disk
        if disk is None:
            return  # unreadable for now (a network filesystem's hiccup): the levels stay
        if disk.mount != self._levels_mount:
            self._levels_mount, self.disk_levels = disk.mount, []  # another filesystem: anew
        # Half a save is not a level; but the first read of a filesystem is its baseline (read
        # as the first save to it begins: without it that save would be no rise).
        if SAVES.started == SAVES.returned or not self.disk_levels:
            if not self.disk_levels and SAVES.started == SAVES.returned:
                self.disk_levels = _before_first_save(disk)
            self.disk_levels = kept_levels(self.disk_levels, time.time(), disk.used)

    def _reopen(self, level: CgroupFiles | None) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._cgroup = level
        if level is not None:
            try:
                self._fd = os.open(level.usage, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._fd = None

    def fill(self, s: RankState, saved_to: str, slow_ok: bool, torch_ready: bool) -> None:
        """*s*'s resource fields: the cgroup's use every sample; the slow reads when due and
        *slow_ok* (or at once for a new checkpoint directory, *saved_to*)."""
        saves = SAVES.returned
        if saved_to != self.saved_to:
            self.saved_to = saved_to
            self.refresh(force=True)
        elif slow_ok:
            self.refresh()
        if saves != self._saves_seen:  # a save returned since the last sample: its disk now
            self._saves_seen = saves
            self._read_disk()
        s.cgroup_path, s.cgroup_memory_limit_bytes = self.cgroup_path, self.cgroup_limit
        s.cgroup_memory_bytes = self.cgroup_usage()
        disk = self.disk
        s.disk_path = self.checkpoint_dir or self.saved_to
        s.disk_mount = disk.mount if disk else ""
        s.disk_used_bytes, s.disk_total_bytes = (disk.used, disk.total) if disk else (None, None)
        s.disk_levels = self.disk_levels
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        if torch_ready and cuda is not None and cuda.is_initialized():  # never initialised here
            s.gpu_reserved_bytes = int(cuda.memory_reserved())

    @property
    def cgroup_path(self) -> str:
        return self._cgroup.path if self._cgroup is not None else ""
