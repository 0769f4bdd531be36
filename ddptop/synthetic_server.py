"""The serving side of the synthetic job: one selector for many fake ranks, and process plumbing.

A ``ReporterServer`` per rank would cost one selector (an epoll fd and a poll call) per
rank, which does not scale to 4096 ranks in one thread; ``MultiRankServer`` serves many
listeners from one selector with the same protocol: both sides send the stream header,
the rank sends ``Hello`` (with a nonce when a token is set), a viewer may prove the token,
then sends read-only ``Request`` commands and gets replies carrying the request's id;
subscribers get every state the rank publishes. Framing is ``ddptop.wire``'s; a peer that
sends garbage is dropped without disturbing anyone else. Also here: the RLIMIT_NOFILE
check, discovery records in a given directory, and the subprocess handle.
"""

from __future__ import annotations

import logging
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ddptop import auth, discovery
from ddptop.discovery import Endpoint
from ddptop.errors import DdptopError, ProtocolError, UsageError
from ddptop.protocol import (
    COMMANDS,
    PROTOCOL_VERSION,
    AuthProof,
    AuthResult,
    ErrorMsg,
    Hello,
    Message,
    Request,
)
from ddptop.wire import FrameBuffer, encode_frame, header_bytes

log = logging.getLogger(__name__)

MAX_CLIENT_OUTPUT = 2 * 1024 * 1024  # a viewer that reads slower than this loses state frames
MAX_REQUEST_BYTES = 64 * 1024
MAX_CLIENTS_PER_RANK = 64

RankHandler = Callable[[int, Request], Message]


@dataclass(eq=False)
class _Listener:
    rank: int
    sock: socket.socket
    port: int
    clients: set[_Client] = field(default_factory=set)


@dataclass(eq=False)
class _Client:
    listener: _Listener
    sock: socket.socket
    inbuf: FrameBuffer = field(default_factory=lambda: FrameBuffer(limit=MAX_REQUEST_BYTES))
    out: bytearray = field(default_factory=bytearray)
    nonce: str = ""
    authed: bool = False
    subscribed: bool = False
    writing: bool = False  # registered for EVENT_WRITE


class MultiRankServer:
    """Listeners for many ranks of one job, served by the caller's thread via :meth:`poll`."""

    def __init__(self, job_id: str, handler: RankHandler, host: str = "127.0.0.1",
                 token: str | None = None) -> None:
        self.job_id = job_id
        self.host = host
        self._handler = handler
        self._token = token
        self._sel = selectors.DefaultSelector()
        self._listeners: dict[int, _Listener] = {}
        # The wake pair lets another thread interrupt a long select (stop, close_rank).
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.dropped_frames = 0
        self.rejected_peers = 0

    def add_rank(self, rank: int, port: int = 0) -> int:
        """Open *rank*'s listener; return its port."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, port))
            sock.listen(16)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        listener = _Listener(rank=rank, sock=sock, port=int(sock.getsockname()[1]))
        self._listeners[rank] = listener
        self._sel.register(sock, selectors.EVENT_READ, listener)
        return listener.port

    def close_rank(self, rank: int) -> None:
        """Close *rank*'s listener and every viewer connected to it (a rank that died)."""
        listener = self._listeners.pop(rank, None)
        if listener is None:
            return
        for client in list(listener.clients):
            self._drop(client, None)
        self._unregister(listener.sock)
        listener.sock.close()

    def ranks(self) -> list[int]:
        """Ranks whose listener is open."""
        return sorted(self._listeners)

    def subscribers(self, rank: int) -> int:
        """Viewers subscribed to *rank*'s state stream."""
        listener = self._listeners.get(rank)
        return sum(1 for c in listener.clients if c.subscribed) if listener else 0

    def client_count(self) -> int:
        """Connected viewers over all ranks."""
        return sum(len(lst.clients) for lst in self._listeners.values())

    def wake(self) -> None:
        """Interrupt a :meth:`poll` running in another thread."""
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def poll(self, timeout: float) -> None:
        """Serve sockets for up to *timeout* seconds."""
        for key, events in self._sel.select(timeout):
            data = key.data
            if data is None:
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
            elif isinstance(data, _Listener):
                self._accept(data)
            else:
                if events & selectors.EVENT_READ:
                    self._read(data)
                if events & selectors.EVENT_WRITE and data in data.listener.clients:
                    self._flush(data)

    def publish(self, rank: int, message: Message) -> bool:
        """Send *message* to *rank*'s subscribers (encoded once); False if nobody listens."""
        listener = self._listeners.get(rank)
        if listener is None:
            return False
        subs = [c for c in listener.clients if c.subscribed and c.authed]
        if not subs:
            return False
        frame = encode_frame(message)
        for client in subs:
            self._send(client, frame, droppable=True)
        return True

    def close(self) -> None:
        """Close every socket."""
        for rank in list(self._listeners):
            self.close_rank(rank)
        for s in (self._wake_r, self._wake_w):
            self._unregister(s)
            s.close()
        self._sel.close()

    # ---------------------------------------------------------------- internals

    def _accept(self, listener: _Listener) -> None:
        try:
            sock, _ = listener.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        if len(listener.clients) >= MAX_CLIENTS_PER_RANK:
            sock.close()
            self.rejected_peers += 1
            return
        sock.setblocking(False)
        client = _Client(listener=listener, sock=sock)
        listener.clients.add(client)
        self._sel.register(sock, selectors.EVENT_READ, client)
        hello = Hello(protocol=PROTOCOL_VERSION, role="rank", rank=listener.rank, job_id=self.job_id)
        if self._token:
            client.nonce = auth.new_nonce()
            hello.nonce, hello.auth_required = client.nonce, True
        else:
            client.authed = True
        self._send(client, header_bytes() + encode_frame(hello), droppable=False)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(client, f"read error: {exc}")
            return
        if not data:
            self._drop(client, None)
            return
        try:
            messages = client.inbuf.feed(data)
        except ProtocolError as exc:
            self.rejected_peers += 1
            self._drop(client, str(exc))
            return
        for message in messages:
            if client not in client.listener.clients:
                return
            self._dispatch(client, message)

    def _dispatch(self, client: _Client, message: Message) -> None:
        if not client.authed:
            ok = isinstance(message, AuthProof) and bool(self._token) and auth.verify(
                self._token or "", client.nonce, message.mac)
            self._send(client, encode_frame(AuthResult(ok=ok, reason="" if ok else "bad token")),
                       droppable=False)
            if ok:
                client.authed = True
            else:
                self.rejected_peers += 1
                self._drop(client, "authentication failed")
            return
        if not isinstance(message, Request) or message.command not in COMMANDS:
            what = message.command if isinstance(message, Request) else type(message).__name__
            self._send(client, encode_frame(ErrorMsg(reason=f"unsupported request {what!r}",
                                                     id=getattr(message, "id", 0))), droppable=False)
            return
        if message.command == "unsubscribe":
            client.subscribed = False
            return
        client.subscribed = client.subscribed or message.command == "subscribe"
        try:
            reply = self._handler(client.listener.rank, message)
            frame = encode_frame(reply)
        except Exception as exc:  # a failing request must not kill the server
            log.warning("synthetic rank %d: %s failed: %s", client.listener.rank, message.command, exc)
            frame = encode_frame(ErrorMsg(reason=f"{message.command} failed: {exc}", id=message.id))
        self._send(client, frame, droppable=False)

    def _send(self, client: _Client, frame: bytes, droppable: bool) -> None:
        if droppable and len(client.out) + len(frame) > MAX_CLIENT_OUTPUT:
            self.dropped_frames += 1
            return
        client.out += frame
        self._flush(client)

    def _flush(self, client: _Client) -> None:
        try:
            while client.out:
                sent = client.sock.send(client.out)
                del client.out[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self._drop(client, f"write error: {exc}")
            return
        want = bool(client.out)
        if want == client.writing:
            return  # saves an epoll_ctl per frame: the common case at thousands of frames/s
        client.writing = want
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
        try:
            self._sel.modify(client.sock, events, client)
        except (KeyError, ValueError):
            pass

    def _drop(self, client: _Client, reason: str | None) -> None:
        if reason:
            log.info("synthetic rank %d: dropped viewer: %s", client.listener.rank, reason)
        client.listener.clients.discard(client)
        self._unregister(client.sock)
        client.sock.close()

    def _unregister(self, sock: socket.socket) -> None:
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass


def ensure_fd_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE to cover *needed* fds; UsageError if the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return int(soft)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise UsageError(f"this needs about {needed} open files but the hard limit is {hard} "
                         "(`ulimit -Hn`); use fewer ranks or raise the limit")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else needed, hard))
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])



def write_record_in(directory: Path, endpoint: Endpoint) -> None:
    """Atomically write *endpoint*'s discovery record into *directory* (not only $DDPTOP_RUNTIME_DIR)."""
    path = directory / f"{endpoint.job_id}.{endpoint.rank}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(endpoint.to_json())
    os.replace(tmp, path)


class SyntheticProcess:
    """A generator running in its own process group; :meth:`stop` kills the whole group."""

    def __init__(self, proc: subprocess.Popen[bytes], banner: str) -> None:
        self.proc, self.banner = proc, banner

    @property
    def pid(self) -> int:
        """The generator's pid (also the pid in its discovery records)."""
        return self.proc.pid

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it if it lingers; always reaps."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                continue
        if self.proc.poll() is None:
            self.proc.wait(timeout=timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SyntheticProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def run_in_subprocess(n_ranks: int, job_id: str, scenario: str = "healthy", interval_s: float = 1.0,
                      runtime_dir: str | Path | None = None, *, seed: int = 0,
                      extra_args: tuple[str, ...] = (), ready_timeout: float = 120.0) -> SyntheticProcess:
    """Start ``python -m ddptop.synthetic`` in a new session; return once every record is written."""
    env = dict(os.environ)
    if runtime_dir is not None:
        env[discovery.RUNTIME_ENV] = str(runtime_dir)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "ddptop.synthetic", "--ranks", str(n_ranks), "--job-id", job_id,
           "--scenario", scenario, "--interval", str(interval_s), "--seed", str(seed), *extra_args]
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child's stderr
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=errors, start_new_session=True)
    handle = SyntheticProcess(proc, "")
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if sel.select(min(0.5, max(0.0, deadline - time.monotonic()))):
                handle.banner = proc.stdout.readline().decode().strip()
                break
    if not handle.banner.startswith("ready"):
        handle.stop()
        errors.seek(0)
        tail = errors.read().decode(errors="replace")[-2000:]
        errors.close()
        raise DdptopError(f"synthetic job {job_id} did not start within {ready_timeout:g} s: {tail}")
    errors.close()
    return handle
