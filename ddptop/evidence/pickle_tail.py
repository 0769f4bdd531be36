"""Unpickle only the newest entries of a pickled Flight Recorder dump.

A dump is one dict whose ``entries`` list holds up to ``TORCH_FR_BUFFER_SIZE`` (2000) entries,
and a post-mortem compares only each group's last ones: building the other 95 % of the
objects was most of the time of reading a set of 1024 dumps. Pickle has no index, but every
entry of a dump starts the same way (an empty dict, maybe memoized, a mark, then its first
key: the same string, written once and then fetched from the memo), so the entries are
counted with one ``bytes.count`` and the newest found with ``rfind`` (C speed, no parse), and
the stream is cut there:

* the head (everything before the entries, plus the first few entries) is unpickled with the
  open containers closed, for the top-level fields and the memo (the strings that later
  entries fetch instead of repeating);
* the tail (the last *count* entries and what follows the list) is unpickled after a
  prefix that opens the same containers, with the head's memo.

Exact or nothing: an entry that fetches a string first written in the skipped middle fails
(a missing memo index), and so does any cut that is not a real entry boundary; the caller
then unpickles the whole file. Both halves go through the same data-only unpickler.
"""

from __future__ import annotations

import io
import re
import struct
from typing import Any

from ddptop.evidence.safe_pickle import UNREADABLE, DataOnly, guarded

_ENTRIES_KEY = b"X\x07\x00\x00\x00entries"
_PUT = re.compile(rb"q[\s\S]|r[\s\S]{4}")  # BINPUT n | LONG_BINPUT n (memoizing what precedes)
HEAD_ENTRIES = 4  # entries unpickled with the head: their strings fill the memo
# The tail is opened as the dump is: a dict, its mark, the key, an empty list, its mark.
_TAIL_PREFIX = b"\x80\x02}(" + _ENTRIES_KEY + b"]("


def _skip_put(data: bytes, at: int) -> int:
    match = _PUT.match(data, at)
    return match.end() if match else at


def _memo_index(data: bytes, at: int) -> int | None:
    """The memo index a BINPUT / LONG_BINPUT at *at* stores into, if there is one."""
    if data[at:at + 1] == b"q" and at + 1 < len(data):
        return data[at + 1]
    if data[at:at + 1] == b"r" and at + 5 <= len(data):
        return int(struct.unpack_from("<I", data, at + 1)[0])
    return None


class TailReader:
    """One pickled dump, its head unpickled; :meth:`last` unpickles its last entries."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.top: dict[str, Any] = {}
        self.total = 0  # entries in the dump (0: the shortcut does not apply)
        self._signature = b""
        self._head: DataOnly | None = None
        found = _first_entry(data)
        if found is None:
            return
        first, self._signature, memoized = found
        # A memoized first key is written out in the first entry and fetched in the others.
        since = first + 1 if memoized else first
        self.total = int(memoized) + data.count(self._signature, since)
        head_end = self._start_after(since, HEAD_ENTRIES - int(memoized))
        if self.total <= HEAD_ENTRIES or head_end < 0:
            self.total = 0
            return
        self._head = DataOnly(io.BytesIO(data[:head_end] + b"eu."))  # close the list and the dict
        try:
            with guarded():
                top = self._head.load()
        except _FAILURES:
            self.total = 0
            return
        self.top = top if isinstance(top, dict) else {}

    def last(self, count: int) -> list[Any] | None:
        """The last *count* entries (None where that is all of them, or not exact)."""
        if self._head is None or count + HEAD_ENTRIES >= self.total:
            return None
        start = self._start_before(len(self.data), count)
        if start < 0:
            return None
        tail_data = _TAIL_PREFIX + self.data[start:]
        # A reader with peek() lets the C unpickler prefetch (a plain BytesIO costs it 2x).
        reader = io.BufferedReader(io.BytesIO(tail_data), buffer_size=min(len(tail_data) + 1, 1 << 22))
        tail = DataOnly(reader)
        try:
            with guarded():
                tail.memo = self._head.memo  # what the tail fetches was written in the head, or it fails
                rest = tail.load()
        except _FAILURES:
            return None
        entries = rest.get("entries") if isinstance(rest, dict) else None
        if (not isinstance(entries, list) or len(entries) != count
                or not all(isinstance(e, dict) for e in entries)):
            return None
        self.top.update((k, v) for k, v in rest.items() if k != "entries")  # fields after the list
        return entries

    def _start_after(self, since: int, n: int) -> int:
        """The start of the *n*-th entry whose signature lies after *since* (-1: not so many)."""
        at = since - 1
        for _ in range(n):
            at = self.data.find(self._signature, at + 1)
            if at < 0:
                return -1
        return _dict_before(self.data, at)

    def _start_before(self, end: int, n: int) -> int:
        """The start of the *n*-th entry counted back from *end* (-1 if there are not so many)."""
        at = end
        for _ in range(n):
            at = self.data.rfind(self._signature, 0, at)
            if at < 0:
                return -1
            at = _dict_before(self.data, at)
            if at < 0:
                return -1
        return at


_FAILURES = (*UNREADABLE, RecursionError)


def _dict_before(data: bytes, at: int) -> int:
    """Where the empty dict that opens the entry whose signature is at *at* starts (-1: none)."""
    if data[at - 1:at] == b"}":
        return at - 1
    if data[at - 3:at - 1] == b"}q":
        return at - 3
    if data[at - 6:at - 4] == b"}r":
        return at - 6
    return -1


def _first_entry(data: bytes) -> tuple[int, bytes, bool] | None:
    """Where the ``entries`` list's first entry starts, the bytes every entry's first key
    starts with after the entry's opening dict, and whether that key is memoized (None: not
    a dump of that shape)."""
    key = data.find(_ENTRIES_KEY)
    if key < 0:
        return None
    at = _skip_put(data, key + len(_ENTRIES_KEY))
    if data[at:at + 1] != b"]":
        return None
    at = _skip_put(data, at + 1)
    if data[at:at + 1] != b"(" or data[at + 1:at + 2] != b"}":
        return None  # an empty list, or not a list of dicts
    first = at + 1
    body = _skip_put(data, first + 1)
    if data[body:body + 2] != b"(X" or body + 6 > len(data):
        return None
    (length,) = struct.unpack_from("<I", data, body + 2)
    after_key = body + 6 + length
    index = _memo_index(data, after_key)
    if index is None:  # the key is not memoized: every entry writes it out
        return first, data[body:after_key], False
    return first, b"(" + (b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)), True
