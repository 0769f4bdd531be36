"""Read torchelastic's error file: the exception a rank wrapped in ``@record`` died of.

``torch.distributed.elastic.multiprocessing.errors.record`` writes, to
``$TORCHELASTIC_ERROR_FILE`` (``<log_dir>/<run>/attempt_N/<local_rank>/error.json``)::

    {"message": {"message": "RuntimeError: ...",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1763940683"}}}

The file names no rank: it is the number of the folder it lies in (the *local* rank; on
one node the global one), unless torchrun's log names the file (see torchrun_log).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ddptop.errors import EvidenceError
from ddptop.evidence.types import RankFailure
from ddptop.store.remains import read_bounded

MAX_ERROR_FILE_BYTES = 4 << 20
MAX_TRACEBACK_LINES = 200


def looks_like_elastic_error(head: bytes) -> bool:
    """True if the first bytes are those of a torchelastic error file."""
    text = head.lstrip()
    return text[:1] == b"{" and b'"message"' in text and (b'"extraInfo"' in text or b'"errorCode"' in text
                                                        or b'"py_callstack"' in text)


def read_elastic_error(path: str | os.PathLike[str]) -> list[RankFailure]:
    """The failure an error file records (one), EvidenceError if it is not one."""
    p = Path(path)
    try:
        data, _size = read_bounded(p, MAX_ERROR_FILE_BYTES + 1, tail=False)
    except OSError as exc:
        raise EvidenceError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_ERROR_FILE_BYTES:
        raise EvidenceError(f"{p}: over the {MAX_ERROR_FILE_BYTES >> 20} MiB cap for an error file")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise EvidenceError(f"{p}: not a readable error file ({str(exc)[:80]})") from None
    message = doc.get("message") if isinstance(doc, dict) else None
    if isinstance(message, str):  # a root cause whose error code torchrun rewrote keeps this shape
        message = {"message": message}
    if not isinstance(message, dict):
        raise EvidenceError(f"{p}: not a torchelastic error file (no message)")
    text = str(message.get("message", ""))
    info = message.get("extraInfo")
    extra: dict[str, Any] = info if isinstance(info, dict) else {}
    stack = str(extra.get("py_callstack", ""))
    stamp = str(extra.get("timestamp", ""))
    rank = int(p.parent.name) if p.parent.name.isdigit() else None
    if rank is None:
        raise EvidenceError(f"{p}: the error file lies in no <local_rank> folder; its rank is unknown")
    return [RankFailure(rank=rank, source=str(p), time=float(stamp) if stamp.isdigit() else 0.0,
                        message=_first_line(text), traceback=stack.splitlines()[-MAX_TRACEBACK_LINES:])]


def _first_line(text: str) -> str:
    # The message is f"{type(e).__name__}: {e}": its first line names the exception.
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:500] if lines else ""
