"""Find and read the evidence in the paths a person names: recognised by content, capped.

``ddptop doctor|replay|export PATH...`` takes folders and files: Flight Recorder dumps
(pickle or JSON, any prefix or host in the name), torchrun's log, torchelastic's error
files, ddptop recordings, bundles and black-box recordings, or a mix. Each file is recognised
by its first bytes, never by its name; what cannot be read is a one-line warning naming it
while the rest is analysed. Links are not followed, folders are walked to a bounded depth,
and the number of files and bytes read is capped per set.
"""

from __future__ import annotations

import multiprocessing
import os
import stat
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ddptop.bundle.format import GZIP_MAGIC
from ddptop.bundle.reader import Contents
from ddptop.bundle.record_dir import HISTORY_FILE, RECENT_GLOB, read_recording
from ddptop.diagnosis.claims import Claim
from ddptop.errors import BundleError, DdptopError
from ddptop.evidence import elastic_error, frdump, torchrun_log
from ddptop.evidence.fold import fold_evidence
from ddptop.evidence.types import RankDump, RankFailure
from ddptop.store.remains import read_bounded
from ddptop.wire import MAGIC

CONSOLE_FILE = "console.log"  # ddptop launch's tail of the job's stderr (agent/stderr_tail.py)
HEAD_BYTES = 4096  # what recognising a file reads of it
TAIL_BYTES = 64 << 10  # and of a longer text file's end, where its head is the training's own output
MAX_DEPTH = 4  # folders below a named one
MAX_FILES = 100_000  # files looked at, per set
MAX_SET_BYTES = 4 << 30  # bytes of evidence read, per set
PARALLEL_FROM = 64  # dumps in a set from which they are read on several processes
MAX_WORKERS = 8


@dataclass
class Evidence:
    """What the paths held, read and typed."""

    dumps: list[RankDump] = field(default_factory=list)
    failures: list[RankFailure] = field(default_factory=list)
    recordings: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ignored: list[Path] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)  # what console logs' statements claim
    console_logs: int = 0  # text files read as a job's console

    def empty(self) -> bool:
        """Nothing usable was found (a console log read is something, even one that names no rank)."""
        return not (self.dumps or self.failures or self.recordings or self.console_logs)


def is_recording(path: Path) -> bool:
    """A ddptop recording, bundle or black-box record directory."""
    if path.is_dir():
        return (path / HISTORY_FILE).is_file() or any(path.glob(RECENT_GLOB))
    return _head(path)[:2] in (GZIP_MAGIC, MAGIC[:2])


def gather(paths: Sequence[str | os.PathLike[str]]) -> Evidence:
    """Every piece of evidence under *paths*; DdptopError if a named path does not exist."""
    found = Evidence()
    budget = [MAX_SET_BYTES]
    pending: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists() and not path.is_symlink():
            raise DdptopError(f"{raw}: no such file or folder")
        if path.is_dir() and is_recording(path):
            found.recordings.append(path)
            for child in _files(path, found):  # launch puts NCCL's dumps into the job's record directory
                if child.name in (CONSOLE_FILE, CONSOLE_FILE + ".1"):
                    _read_console(child, found)  # the job's own stderr, whatever it starts with
                elif not child.name.endswith(".ddptop"):
                    _read_one(child, found, budget, pending)
            continue
        if not path.is_dir():
            _read_one(path, found, budget, pending, named=True)
            continue
        for file in _files(path, found):
            _read_one(file, found, budget, pending)
    _read_dumps(pending, found)
    return found


def _read_console(path: Path, found: Evidence) -> None:
    """The job's stderr as ddptop launch kept it: its notes on ranks a line cannot prove are
    left out (the recording beside it knows every rank's identity; one node's launch)."""
    try:
        found.failures += torchrun_log.read_log(path)[0]
    except DdptopError as exc:
        found.warnings.append(str(exc))


def _read_log(path: Path, found: Evidence) -> None:
    log = torchrun_log.read_console_log(path)
    found.failures += log.failures
    found.warnings += log.notes
    found.claims += log.claims
    found.console_logs += 1


def _read_dumps(paths: list[Path], found: Evidence) -> None:
    """Read every dump; a large set on several processes (unpickling is CPU-bound, GIL-bound)."""
    workers = min(os.cpu_count() or 1, MAX_WORKERS)
    if len(paths) < PARALLEL_FROM or workers < 2:
        results = [_read_dump_quietly(p) for p in paths]
    else:
        ctx = multiprocessing.get_context("fork")  # the CLI holds no threads at this point
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            packed = pool.map(_read_dump_packed, paths, chunksize=max(1, len(paths) // (workers * 8)))
            results = [_unpack(p) for p in packed]
    for result in results:
        if isinstance(result, str):
            found.warnings.append(result)
        else:
            found.dumps.append(result)


def _read_dump_quietly(path: Path) -> RankDump | str:
    try:
        return frdump.read_dump(path)
    except DdptopError as exc:
        return str(exc)


_dump_decoder = msgspec.msgpack.Decoder(RankDump)


def _read_dump_packed(path: Path) -> bytes | str:
    """A worker's answer as msgpack: 5x cheaper for the parent to take than a pickled struct,
    and the parent shares the two cores with the workers."""
    result = _read_dump_quietly(path)
    return result if isinstance(result, str) else msgspec.msgpack.encode(result)


def _unpack(result: bytes | str) -> RankDump | str:
    return result if isinstance(result, str) else _dump_decoder.decode(result)


def load_evidence(paths: Sequence[str | os.PathLike[str]], *, job_id: str = "") -> Contents:
    """The paths' evidence as one recording's contents (BundleError if there is none)."""
    found = gather(paths)
    if found.empty():
        names = ", ".join(str(p) for p in paths)
        said = f"; {found.warnings[-1]}" if found.warnings else ""
        raise BundleError(f"{names}: no Flight Recorder dump, torchrun log, torchelastic error file or "
                          f"ddptop recording found ({len(found.ignored)} file(s) not recognised){said}")
    base: Contents | None = None
    if found.recordings:
        base = read_recording(found.recordings[0])
        if len(found.recordings) > 1:
            found.warnings.append("also found " + ", ".join(str(p) for p in found.recordings[1:])
                                  + ": only the first recording is read")
        if not found.dumps and not found.failures:
            base.warnings += found.warnings
            base.log_claims, base.console_logs = [*base.log_claims, *found.claims], found.console_logs
            return base
    name = job_id or _job_name(paths)
    kept = base.log_claims if base is not None else []  # a bundle of a log keeps the log's claims
    contents = fold_evidence(found.dumps, found.failures, job_id=name, path=str(paths[0]),
                             warnings=found.warnings, base=base)
    contents.log_claims, contents.console_logs = [*kept, *found.claims], found.console_logs
    return contents


def _job_name(paths: Sequence[str | os.PathLike[str]]) -> str:
    first = Path(paths[0]).resolve()
    return (first if first.is_dir() else first.parent).name or "evidence"


def _files(folder: Path, found: Evidence, depth: int = 0) -> Iterator[Path]:
    """Regular files under *folder*, sorted, links not followed, depth and count bounded."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        found.warnings.append(f"{folder}: cannot list ({exc.strerror or exc})")
        return
    for entry in entries:
        if len(found.ignored) + len(found.dumps) + len(found.failures) >= MAX_FILES:
            found.warnings.append(f"{folder}: more than {MAX_FILES} files; the rest were not read")
            return
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            if depth < MAX_DEPTH:
                yield from _files(Path(entry.path), found, depth + 1)
        elif entry.is_file(follow_symlinks=False):
            yield Path(entry.path)


def _head(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, HEAD_BYTES)
    finally:
        os.close(fd)


def _is_text(head: bytes) -> bool:
    """Text a person could have pasted: no NUL, and UTF-8 (a cut multi-byte character at the
    end of the head aside) or mostly printable."""
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        if exc.start >= len(head) - 3:
            return True
    printable = sum(1 for b in head if b >= 32 or b in (9, 10, 13))
    return printable >= 0.95 * len(head)


def _tail(path: Path) -> bytes:
    """The last TAIL_BYTES of a text file (where a failed job's console says why)."""
    try:
        data, _size = read_bounded(path, TAIL_BYTES, tail=True)
    except OSError:
        return b""
    return data


def _read_one(path: Path, found: Evidence, budget: list[int], pending: list[Path],
              named: bool = False) -> None:
    """Read *path* by what its first bytes are; a file the person *named* that is text is read
    as a console log whatever it says (#46: never "not recognised" for a readable log)."""
    head = _head(path)
    if not head:
        found.ignored.append(path)
        return
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size > budget[0]:
        found.warnings.append(f"{path}: not read, the set is over {MAX_SET_BYTES >> 30} GiB")
        return
    budget[0] -= size
    try:
        if head[:2] in (GZIP_MAGIC, MAGIC[:2]):
            found.recordings.append(path)
        elif frdump.looks_like_fr_dump(head):
            pending.append(path)  # read below, all together (in parallel when there are many)
        elif elastic_error.looks_like_elastic_error(head):
            found.failures += elastic_error.read_elastic_error(path)
        elif torchrun_log.looks_like_torchrun_log(head) or (
                size > HEAD_BYTES and torchrun_log.looks_like_torchrun_log(_tail(path))) or (
                named and _is_text(head)):
            _read_log(path, found)  # a long console's first lines may be the training's own output
        else:
            found.ignored.append(path)
    except DdptopError as exc:
        found.warnings.append(str(exc))
