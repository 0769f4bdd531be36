"""The point-to-point op the main thread is blocked in, read from its own stack in-process.

Gloo records no send or recv in its Flight Recorder (seen with torch 2.13: a rank blocked in
``dist.recv`` shows no entry at all, only its group's seq moved on), so a pipeline stage
waiting for its neighbour would look idle. ``dist.send`` and ``dist.recv`` are Python
functions that block in ``work.wait()``: while the main thread is inside one, its frame holds
the peer (``src``/``dst`` as global ranks, or ``group_src``/``group_dst`` within ``group``).
``sys._current_frames()`` hands the reporter thread that frame: no signal, no ptrace, and it
is read only while a group stands still, so a healthy rank pays nothing.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any, NamedTuple

MAX_DEPTH = 64  # frames looked through from the innermost: a blocking call is near the top
_C10D_FILE = "distributed_c10d.py"
_PEER_NAMES = {"recv": ("src", "group_src"), "send": ("dst", "group_dst")}


class P2pWait(NamedTuple):
    """A blocking send or recv the main thread is in."""

    direction: str  # "send" / "recv"
    group: Any  # the ProcessGroup object (None: the default group)
    peer: int | None  # the global rank at the other end (None: any source)


def blocked_p2p(c10d: Any) -> P2pWait | None:
    """The blocking send/recv the main thread is in now, or None (never raises)."""
    try:
        frame: FrameType | None = sys._current_frames().get(threading.main_thread().ident or -1)
        for _ in range(MAX_DEPTH):
            if frame is None:
                return None
            code = frame.f_code
            names = _PEER_NAMES.get(code.co_name)
            if names is not None and code.co_filename.endswith(_C10D_FILE):
                return _wait_in(frame, code.co_name, names, c10d)
            frame = frame.f_back
    except Exception:  # a frame torn down while read, a torch without these names: nothing to say
        return None
    return None


def _wait_in(frame: FrameType, direction: str, names: tuple[str, str], c10d: Any) -> P2pWait:
    local = frame.f_locals  # a snapshot of the frame's variables (3.11), taken under the GIL
    group = local.get("group")
    peer = local.get(names[0])
    within = local.get(names[1])
    if peer is None and isinstance(within, int):
        peer = int(c10d.get_global_rank(group or c10d._get_default_group(), within))
    return P2pWait(direction, group, int(peer) if isinstance(peer, int) else None)
