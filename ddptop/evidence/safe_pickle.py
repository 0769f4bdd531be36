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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ddptop.errors import EvidenceError

MAX_PICKLE_BYTES = 256 << 20


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
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            MemoryError, OverflowError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"not a readable pickle ({type(exc).__name__}: {str(exc)[:80]})") from None


@contextmanager
def guarded() -> Iterator[None]:
    """The collector paused while a dump is built: millions of small dicts and no cycles, it
    would only walk them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
