"""A real ReporterServer on loopback, polled by a thread, and raw peers to talk to it.

Shared by the protocol robustness, server limits and property tests.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ddptop.net.server import ReporterServer
from ddptop.protocol import Hello, Message, RankState, Request, StateMsg
from ddptop.store import discovery
from ddptop.wire import FrameBuffer
from tests.rank_connection import RankConnection

TOKEN = "correct horse battery staple"


def rank_state(rank: int = 0, pad: int = 0) -> RankState:
    """A small RankState at step 7, padded by *pad* bytes of environment."""
    env = {"PAD": "x" * pad} if pad else {}
    return RankState(rank=rank, local_rank=rank, world_size=2, host="h", pid=1, step=7, env=env)


class ServerThread:
    """A ReporterServer polled on its own thread; optionally broadcasting big states."""

    def __init__(self, token: str | None = None, broadcast_pad: int = 0, reply_pad: int = 0,
                 job_id: str = "jobx") -> None:
        self.requests: list[str] = []
        reply_state = rank_state(pad=reply_pad)

        def handler(request: Request) -> Message:
            self.requests.append(request.command)
            return StateMsg(state=reply_state, id=request.id)

        self.server = ReporterServer("127.0.0.1", 0, token, 0, job_id, handler)
        self.endpoint = discovery.Endpoint(job_id=job_id, rank=0, world_size=2, host="127.0.0.1",
                                           port=self.server.port, pid=1)
        self._pad = broadcast_pad
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="test-server", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        big = StateMsg(state=rank_state(pad=self._pad)) if self._pad else None
        while not self._stop.is_set():
            try:
                if big is not None:
                    self.server.broadcast(big)
                self.server.poll(0.01)
            except BaseException as exc:  # the test fails on any escaping error
                self.errors.append(exc)
                return

    def stop(self) -> None:
        """Stop polling and close every socket."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.close()


@contextmanager
def serving(token: str | None = None, broadcast_pad: int = 0, reply_pad: int = 0,
            job_id: str = "jobx") -> Iterator[ServerThread]:
    """A running server for one test, always stopped."""
    srv = ServerThread(token, broadcast_pad, reply_pad, job_id)
    try:
        yield srv
    finally:
        srv.stop()
    assert srv.errors == [], srv.errors


def raw_peer(port: int) -> socket.socket:
    """A blocking loopback socket to *port* with a 5 s timeout."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    return sock


def read_hello(sock: socket.socket) -> tuple[Hello, FrameBuffer]:
    """Read the server's header and Hello; the buffer keeps what follows."""
    buf = FrameBuffer()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        messages = buf.feed(sock.recv(65536))
        if messages:
            assert isinstance(messages[0], Hello)
            return messages[0], buf
    raise AssertionError("no Hello within 5 s")


def closed_by_server(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True once the server closed its end (EOF or reset), within *timeout*."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def healthy_state(srv: ServerThread, token: str | None = None) -> None:
    """A fresh, real viewer asks for the state and gets it."""
    with RankConnection(srv.endpoint, token=token, timeout=5) as conn:
        msg = conn.state()
    assert msg.state.step == 7 and msg.state.rank == 0


def settles(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll *predicate* until true (True) or *timeout* passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


