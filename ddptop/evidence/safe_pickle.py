"""Load a pickle that can never run code: plain data only, bounded.

A Flight Recorder dump is a pickled dict of lists, strings and numbers (torch writes it
with protocol 2). Everything that can import or call (GLOBAL, STACK_GLOBAL, INST, OBJ,
REDUCE, NEWOBJ, BUILD, EXT*, PERSID) needs a callable that only ``find_class`` or
``persistent_load`` can hand out, and both refuse here, so a hostile file fails before
anything is called. Sizes are capped before loading.
"""

from __future__ import annotations

import gc
import io
import pickle
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ddptop.errors import EvidenceError

MAX_PICKLE_BYTES = 256 << 20


# What the C unpickler raises on a damaged or hostile stream (every one a refusal, not a bug).
UNREADABLE = (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
              MemoryError, OverflowError, UnicodeDecodeError)


class DataOnly(pickle.Unpickler):
    """An unpickler that refuses every global and persistent id."""

    def find_class(self, module: str, name: str) -> Any:
        raise EvidenceError(f"refused: the pickle names {module[:60]}.{name[:60]} (code, not data)")

    def persistent_load(self, pid: Any) -> Any:
        raise EvidenceError("refused: the pickle asks for a persistent object (code, not data)")


def loads(data: bytes, max_bytes: int = MAX_PICKLE_BYTES) -> Any:
    """The plain data in *data*; EvidenceError (one line) for anything else."""
    if len(data) > max_bytes:
        raise EvidenceError(f"pickle of {len(data)} bytes is over the {max_bytes >> 20} MiB cap")
    # A reader with peek() lets the C unpickler prefetch: a plain BytesIO costs it 2x.
    stream = io.BufferedReader(io.BytesIO(data), buffer_size=min(len(data) + 1, 1 << 22))
    try:
        with guarded():
            return DataOnly(stream).load()
    except EvidenceError:
        raise
    except RecursionError:
        raise EvidenceError("refused: the pickle nests too deep") from None
    except UNREADABLE as exc:
        raise EvidenceError(f"not a readable pickle ({type(exc).__name__}: {str(exc)[:80]})") from None


MAX_DECODE_GROWTH = 4 << 30  # address space one unpickle may add to the process


@contextmanager
def guarded() -> Iterator[None]:
    """While a dump is built: the collector paused (millions of small dicts and no cycles, it
    would only walk them) and the address space capped, so that a hostile memo index (a
    4-byte LONG_BINPUT makes the C unpickler allocate and zero a table of that size: tens of
    GB) is a MemoryError, not the OOM killer."""
    was_enabled = gc.isenabled()
    gc.disable()
    restore = _cap_address_space(MAX_DECODE_GROWTH)
    try:
        yield
    finally:
        if restore is not None:
            try:
                resource.setrlimit(resource.RLIMIT_AS, restore)
            except (OSError, ValueError):
                pass
        if was_enabled:
            gc.enable()


def _cap_address_space(growth: int) -> tuple[int, int] | None:
    """Lower RLIMIT_AS to the current size + *growth*; the limits to restore (None: unchanged)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/status", "rb") as fh:
            size = next(int(line.split()[1]) * 1024 for line in fh if line.startswith(b"VmSize:"))
        cap = size + growth
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if soft != resource.RLIM_INFINITY and soft <= cap:
            return None  # already as tight
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        return soft, hard
    except (OSError, ValueError, StopIteration):
        return None
