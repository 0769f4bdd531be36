"""A rank's Flight Recorder dump, written the way torch serialises it: shared by the dump probes.

On gloo nothing dumps by itself, so the probes (``fr_dumps.py``, ``moe_groups.py``) play
NCCL's part with torch's own serialisers (``_dump_fr_trace`` for pickle,
``_dump_fr_trace_json`` for JSON), once per process, atomically (a reader never sees half a
dump). :data:`ONCE` is held from the first dump on: a path that finds it taken knows this
rank has dumped (or is dumping, and will end the process).
"""

from __future__ import annotations

import os
import threading
import time

ONCE = threading.Lock()


def dump(prefix: str, rank: int, fmt: str) -> None:
    """Write this rank's Flight Recorder dump to ``<prefix><rank>`` (once per process). *fmt*
    "both": the JSON one to ``<PROBE_DUMP_PREFIX_JSON><rank>`` first, then the pickle one to
    ``<prefix><rank>``, of the same moment (one job gives the tests both formats)."""
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    if not ONCE.acquire(blocking=False):
        time.sleep(600)  # the other path is writing it and will end the process

    targets = [("json", os.environ["PROBE_DUMP_PREFIX_JSON"]), ("pickle", prefix)] if fmt == "both" \
        else [(fmt, prefix)]
    for one, where in targets:
        data = _dump_fr_trace() if one == "pickle" else _dump_fr_trace_json()
        raw = data if isinstance(data, bytes) else str(data).encode()
        tmp = f"{where}{rank}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, f"{where}{rank}")  # a reader never sees half a dump
