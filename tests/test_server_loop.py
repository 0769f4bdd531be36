"""The one selector loop (ddptop.net.loop.ServerLoop): what a poll serves, and frames gathering.

A viewer of thousands of node agents naps ``gather_s`` after each poll that served anything, so
that frames arriving at their own moments are served dozens to a poll (bench: 3,000 polls a
second at 32,768 ranks became 75). Real socket pairs; every wait is bounded.
"""

from __future__ import annotations

import selectors
import socket
import time
from pathlib import Path

from ddptop.client.live import GATHER_FROM_PEERS, LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import resolve
from ddptop.net.loop import ServerLoop
from ddptop.protocol import Event, RecordEntry, StateMsg
from ddptop.testing.synthetic_process import run_in_subprocess
from tests.jobs import wait_until


class _Reader:
    """A registered socket's owner: reads what is there and counts the wake-ups."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.got = b""
        self.calls = 0

    def on_ready(self, events: int) -> None:
        self.calls += 1
        self.got += self.sock.recv(4096)


def _pairs(loop: ServerLoop, n: int) -> list[tuple[socket.socket, _Reader]]:
    out = []
    for _ in range(n):
        a, b = socket.socketpair()
        a.setblocking(False)
        reader = _Reader(a)
        loop.selector.register(a, selectors.EVENT_READ, reader)
        out.append((b, reader))
    return out


def test_a_poll_says_how_many_were_ready_and_naps_only_after_serving() -> None:
    loop = ServerLoop()
    pairs = _pairs(loop, 3)
    try:
        assert loop.poll(0.0, gather_s=30.0) == 0  # nothing ready: no nap (it would take 30 s)
        pairs[0][0].send(b"a")
        pairs[2][0].send(b"c")
        began = time.monotonic()
        assert loop.poll(5.0, gather_s=0.05) == 2
        assert time.monotonic() - began >= 0.05
        assert [r.got for _, r in pairs] == [b"a", b"", b"c"]
    finally:
        for sender, reader in pairs:
            sender.close()
            reader.sock.close()
        loop.close()


def test_a_viewer_of_many_agents_serves_many_frames_a_poll(runtime_dir: Path, via_agent: None) -> None:
    """64 node agents of one rank each, a state every 20 ms: 3,200 frames a second, each at its
    own moment. Served as they come that was 1.6 a poll; gathered, dozens. The job runs in its
    own process (its own GIL): a loaded machine slows it tenfold and still leaves 3 a poll."""
    with run_in_subprocess(GATHER_FROM_PEERS, "ga64", interval_s=0.02, runtime_dir=runtime_dir,
                           extra_args=("--agents-only", "--ranks-per-agent", "1")):
        source = LiveSource(resolve("ga64"), connect_timeout=5.0)
        feed = ModelFeed("ga64", GATHER_FROM_PEERS)
        states = [0]

        def emit(event: Event) -> None:
            states[0] += isinstance(event, RecordEntry) and isinstance(event.message, StateMsg)
            feed.emit(event)

        source.start(emit)
        try:
            wait_until(lambda: feed.settled(range(GATHER_FROM_PEERS)) == GATHER_FROM_PEERS, 30.0,
                       "every rank's state")
            assert source.connections == GATHER_FROM_PEERS
            polls, seen = source._loop.polls, states[0]
            wait_until(lambda: states[0] - seen >= 2000, 60.0, "2,000 more states")
            frames, wakeups = states[0] - seen, source._loop.polls - polls
            assert frames >= 3 * wakeups, (frames, wakeups)
        finally:
            source.stop()
