"""A rank's progress counters in a small shared file page that outlives the rank.

The rank's reporter samples its counters once a second; a rank that dies of SIGKILL or
SIGABRT leaves no last words, and within the second before its death it may have taken
dozens of steps, finished its training pass and started an evaluation loader (#20). So the
training thread's hooks (:mod:`ddptop.reporter.progress`, :mod:`ddptop.reporter.loaders`)
also store their counters into this page, a ``MAP_SHARED`` mapping of
``<job>.<rank>.page`` in the runtime directory: a store into a mapped page costs about what
an attribute store does, needs no system call, and the kernel keeps what was written
whatever kills the process. The node agent reads the page when the rank has died
(:func:`read_page`) and lays it over the rank's last known state (:func:`apply_page`).

Layout (native byte order, one version): int64 slots, a few of them read as doubles.
Writers never read it back and never lock: the reader reads only after the writer died.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import msgspec

from ddptop.rank_state import LoaderInfo, RankState

MAGIC = int.from_bytes(b"ddptpag1", "little")  # the first 8 bytes of a page, once it is whole
VERSION = 1
PAGE_BYTES = 4096
PAGE_LOADERS = 16  # loader records on the page: the newest 16 loaders a rank iterated
LOADER_SLOTS = 8
NAME_BYTES = 64

# Header and job-wide counters (int64 slot numbers; the *_F ones are doubles).
_MAGIC, _VERSION, _PID, _RANK = 0, 1, 2, 3
WALL_OFFSET_F = 4  # wall clock minus perf_counter when the page was made
STEP = 8
LAST_STEP_PC_F = 9
TRAIN_INDEX = 10  # loader index + 1 of the loader that fed the latest step (0: none)
LOADERS = 16
# Per loader, from its base slot.
L_INDEX, L_LENGTH, L_PASSES, L_COMPLETED, L_BATCH, L_STEPS, L_BATCH_SIZE, L_LAST_PC_F = range(8)
NAMES_AT = (LOADERS + PAGE_LOADERS * LOADER_SLOTS) * 8  # byte offset of the loaders' names
assert NAMES_AT + PAGE_LOADERS * NAME_BYTES <= PAGE_BYTES


class ProgressPage:
    """The writer's view: ``ints`` and ``floats`` over the same bytes (a file or private)."""

    def __init__(self, buffer: mmap.mmap | bytearray, path: Path | None = None) -> None:
        self.buffer = buffer
        self.path = path
        self.ints = memoryview(buffer).cast("q")
        self.floats = memoryview(buffer).cast("d")

    @classmethod
    def private(cls) -> ProgressPage:
        """A page in private memory: the hooks write somewhere before (or without) a file."""
        return cls(bytearray(PAGE_BYTES))

    @classmethod
    def create(cls, path: Path, rank: int, wall_offset: float) -> ProgressPage:
        """Make *path* (0600, never through a link) and map it shared; OSError."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, PAGE_BYTES)
            buffer = mmap.mmap(fd, PAGE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        page = cls(buffer, path)
        page.ints[_VERSION], page.ints[_PID], page.ints[_RANK] = VERSION, os.getpid(), rank
        page.floats[WALL_OFFSET_F] = wall_offset
        page.ints[_MAGIC] = MAGIC  # last: a page with the magic is whole
        return page

    def write_loader(self, slot: int, index: int, name: str, length: int | None, passes: int,
                     completed: int, batch: int, steps: int, batch_size: int | None) -> None:
        """One loader's record in full (cold path: a pass begins, or the page is attached)."""
        base = loader_base(slot)
        ints = self.ints
        ints[base + L_INDEX] = index + 1
        ints[base + L_LENGTH] = -1 if length is None else length
        ints[base + L_PASSES], ints[base + L_COMPLETED] = passes, completed
        ints[base + L_BATCH], ints[base + L_STEPS] = batch, steps
        ints[base + L_BATCH_SIZE] = -1 if batch_size is None else batch_size
        raw = name.encode("utf-8", "replace")[:NAME_BYTES]
        at = NAMES_AT + slot * NAME_BYTES
        self.buffer[at:at + NAME_BYTES] = raw.ljust(NAME_BYTES, b"\0")


def loader_base(slot: int) -> int:
    """The first int64 slot of loader record *slot*."""
    return LOADERS + slot * LOADER_SLOTS


class PageFacts(msgspec.Struct, kw_only=True):
    """What a dead rank's page says (wall clock times)."""

    pid: int
    rank: int
    step: int
    last_step_at: float
    train_index: int | None
    loaders: list[LoaderInfo]


def read_page(data: bytes) -> PageFacts | None:
    """Decode a page's bytes; None when they are not a whole page of this version."""
    if len(data) < PAGE_BYTES:
        return None
    ints = struct.unpack_from(f"={PAGE_BYTES // 8}q", data)
    floats = struct.unpack_from(f"={PAGE_BYTES // 8}d", data)
    if ints[_MAGIC] != MAGIC or ints[_VERSION] != VERSION:
        return None
    offset = floats[WALL_OFFSET_F]

    def wall(pc: float) -> float:
        return pc + offset if pc > 0 else 0.0

    step = max(0, ints[STEP])
    loaders: list[LoaderInfo] = []
    for slot in range(PAGE_LOADERS):
        base = loader_base(slot)
        if ints[base + L_INDEX] <= 0:
            continue
        at = NAMES_AT + slot * NAME_BYTES
        name = data[at:at + NAME_BYTES].rstrip(b"\0").decode("utf-8", "replace")
        length, size, steps = ints[base + L_LENGTH], ints[base + L_BATCH_SIZE], max(0, ints[base + L_STEPS])
        passes, completed, batch = (max(0, ints[base + k]) for k in (L_PASSES, L_COMPLETED, L_BATCH))
        if length >= 0 and passes and batch >= length and completed < passes:
            completed += 1  # a trainer that knows the length stops without StopIteration
        loaders.append(LoaderInfo(
            index=ints[base + L_INDEX] - 1, name=name, length=length if length >= 0 else None,
            batch=batch, passes=passes, passes_completed=completed, steps=steps,
            # A loader that fed no step while steps were counted is an evaluation loader.
            role="train" if steps else ("eval" if step else ""),
            batch_size=size if size >= 0 else None, last_batch_at=wall(floats[base + L_LAST_PC_F])))
    loaders.sort(key=lambda info: info.index)
    train = ints[TRAIN_INDEX] - 1
    return PageFacts(pid=ints[_PID], rank=ints[_RANK], step=step, last_step_at=wall(floats[LAST_STEP_PC_F]),
                     train_index=train if train >= 0 else None, loaders=loaders)


def apply_page(state: RankState, facts: PageFacts) -> RankState:
    """*state* (the rank's last sample or words) with what its page knew at its death.

    The page's counters are never older than a sample, so they win; what only the sample
    has (a loader's workers, the system, the collectives) is kept.
    """
    if facts.pid != state.pid or facts.step < state.step:
        return state
    sampled = {info.index: info for info in state.loaders}
    loaders = dict(sampled)
    for info in facts.loaders:
        old = loaders.get(info.index)
        if old is not None:
            info = msgspec.structs.replace(info, workers=old.workers, worker_pids=old.worker_pids,
                                           ready_batches=old.ready_batches, name=info.name or old.name,
                                           rebuilt=old.rebuilt)
        loaders[info.index] = info
    last_at = max([facts.last_step_at, *(info.last_batch_at for info in facts.loaders)])
    fields: dict[str, object] = {"step": facts.step, "loaders": [loaders[i] for i in sorted(loaders)],
                                 "time": max(state.time, last_at)}
    if facts.last_step_at:
        fields["last_step_at"] = facts.last_step_at
    train = loaders.get(facts.train_index) if facts.train_index is not None else None
    if train is not None:
        # The epoch a script gave its sampler (set_epoch) is not on the page: the sample's epoch
        # goes on by the passes the page counted since.
        before = sampled.get(train.index)
        told = state.epoch - max(before.passes - 1, 0) if before is not None and before.role == "train" else 0
        epoch = max(train.passes - 1 + told, 0)
        fields.update(epoch=epoch, batch=train.batch, batches_per_epoch=train.length,
                      last_batch_at=train.last_batch_at or state.last_batch_at)
    return msgspec.structs.replace(state, **fields)
