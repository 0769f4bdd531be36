"""A rank's server under load: bounded output, rate, time and number of peers.

Real sockets against a real :class:`ReporterServer` on loopback (tests/servers.py), and
one real 2-rank job under ``ddptop launch`` flooded by a local client while a real
viewer (``ddptop snapshot --json``) keeps getting answers.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ddptop import auth
from ddptop.errors import ProtocolError
from ddptop.net import limits
from ddptop.protocol import AuthProof, ErrorMsg, Message, ReporterStats, Request, StateMsg
from ddptop.store import discovery, job_token
from ddptop.wire import encode_frame, header_bytes
from tests.jobs import JobRunner
from tests.rank_connection import RankConnection
from tests.servers import (
    TOKEN,
    ServerThread,
    closed_by_server,
    healthy_state,
    raw_peer,
    read_hello,
    serving,
    settles,
)

REPLY_PAD = 64 * 1024  # each reply ~64 KB: without caps a flood queues gigabytes


class Flooder:
    """A peer that sends read-only requests as fast as it can and never reads a reply."""

    def __init__(self, port: int, seconds: float, token: str | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        self.sent_requests = 0
        self._burst = b"".join(encode_frame(Request(command="state", id=i + 1)) for i in range(500))
        self._until = time.monotonic() + seconds
        self._stop = threading.Event()
        self.sock.sendall(header_bytes())
        if token is not None:  # a client of the same user, who can read the job's token
            hello, buf = read_hello(self.sock)
            self.sock.sendall(encode_frame(AuthProof(mac=auth.prove(token, hello.nonce))))
            deadline = time.monotonic() + 5
            while not buf.feed(self.sock.recv(65536)) and time.monotonic() < deadline:
                pass  # until the AuthResult
        self.sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._run, name="flooder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._until:
            try:
                self.sock.sendall(self._burst)
                self.sent_requests += 500
            except TimeoutError:
                continue  # the server stopped reading us: TCP pushes back, as intended
            except OSError:
                return  # the server closed us

    def stop(self) -> None:
        """Stop flooding and close the socket."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def _watch_buffers(srv: ServerThread, seconds: float) -> int:
    """Peak of the server's buffered bytes, sampled for *seconds*; a viewer is served meanwhile."""
    peak, deadline, served = 0, time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        peak = max(peak, srv.server.buffered_bytes)
        if served < 3:
            healthy_state(srv)  # a real viewer is answered during the flood
            served += 1
        time.sleep(0.01)
    return peak


def _flood(srv: ServerThread) -> tuple[int, int]:
    """Flood *srv* without reading; return the peak of its buffers and the requests sent."""
    flood = Flooder(srv.server.port, seconds=30)
    try:
        assert settles(lambda: flood.sent_requests >= 2000, timeout=10)
        peak = _watch_buffers(srv, seconds=2.0)
        sent = flood.sent_requests
    finally:
        flood.stop()
    bound = limits.MAX_REPLY_OUTPUT + 2 * REPLY_PAD + limits.MAX_REQUEST_BYTES + limits.RECV_BYTES
    assert peak <= bound, f"server buffered {peak} bytes (bound {bound})"
    assert settles(lambda: srv.server.client_count == 0)
    healthy_state(srv)
    return peak, sent


def test_flood_without_reading_is_rate_limited() -> None:
    """Requests never read back: the rate limit handles a few, TCP holds back the rest."""
    with serving(reply_pad=REPLY_PAD) as srv:
        _, sent = _flood(srv)
        assert srv.server.counters.rate_limited > 0
        assert len(srv.requests) < sent / 10  # most of the flood was never handled


def test_flood_without_reading_is_bounded_by_output_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no rate limit at all, the reply cap and read backpressure alone bound the server."""
    monkeypatch.setattr(limits, "REQUEST_RATE", 1e9)
    monkeypatch.setattr(limits, "REQUEST_BURST", 1e9)
    with serving(reply_pad=REPLY_PAD) as srv:
        _flood(srv)
        assert srv.server.counters.read_pauses > 0
        assert srv.server.counters.rate_limited == 0


def test_rate_limit_refuses_then_recovers() -> None:
    """A reading peer over the rate gets a refusal it can see, then is served again."""
    with serving() as srv:
        sock = raw_peer(srv.server.port)
        sock.sendall(header_bytes())
        _, buf = read_hello(sock)
        n = int(limits.REQUEST_BURST) * 3
        sock.sendall(b"".join(encode_frame(Request(command="state", id=i + 1)) for i in range(n)))
        got: list[Message] = []
        deadline = time.monotonic() + 5
        while not any(isinstance(m, ErrorMsg) for m in got) and time.monotonic() < deadline:
            got += buf.feed(sock.recv(65536))
        refusals = [m for m in got if isinstance(m, ErrorMsg)]
        assert refusals and "rate limited" in refusals[0].reason
        assert srv.server.counters.rate_limited > 0
        assert len(srv.requests) <= limits.REQUEST_BURST + 2
        # The same connection is answered again once the bucket refills (bounded wait).
        answered = False
        deadline = time.monotonic() + 10
        ident = 10_000
        while not answered and time.monotonic() < deadline:
            ident += 1
            sock.sendall(encode_frame(Request(command="state", id=ident)))
            reply: Message | None = None
            while reply is None:
                for m in buf.feed(sock.recv(65536)):
                    if getattr(m, "id", 0) == ident:
                        reply = m
            answered = isinstance(reply, StateMsg)
            if not answered:
                time.sleep(0.1)
        sock.close()
        assert answered


def test_silent_and_half_open_peers_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer that never sends its header, or never proves the token, is closed and counted."""
    monkeypatch.setattr(limits, "HANDSHAKE_TIMEOUT_S", 0.5)
    with serving(token=TOKEN) as srv:
        silent = raw_peer(srv.server.port)
        half = raw_peer(srv.server.port)
        half.sendall(header_bytes())
        read_hello(half)  # sent the header, never the proof
        assert closed_by_server(silent, timeout=10)
        assert closed_by_server(half, timeout=10)
        silent.close()
        half.close()
        assert srv.server.counters.timed_out_peers >= 2
        healthy_state(srv, token=TOKEN)


def test_idle_viewer_is_closed_but_a_reading_subscriber_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Silence is fine for a subscriber that reads its stream, not for an idle connection."""
    monkeypatch.setattr(limits, "IDLE_TIMEOUT_S", 0.5)
    with serving(broadcast_pad=16) as srv, RankConnection(srv.endpoint, timeout=5) as viewer:
        stream = viewer.subscribe()
        first = next(stream)
        idle = raw_peer(srv.server.port)
        idle.sendall(header_bytes())
        read_hello(idle)
        assert closed_by_server(idle, timeout=10)
        idle.close()
        # The subscriber connected before the idle peer, and still gets frames after.
        assert isinstance(first, StateMsg) and isinstance(next(stream), StateMsg)
        assert srv.server.counters.timed_out_peers >= 1


def test_handshaking_pool_evicts_oldest_and_admits_a_viewer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many silent sockets cannot keep a real viewer (with or without a token) out."""
    monkeypatch.setattr(limits, "MAX_PENDING", 4)
    for token in (None, TOKEN):
        with serving(token=token) as srv:
            silent = [raw_peer(srv.server.port) for _ in range(12)]
            try:
                assert settles(lambda: srv.server.counters.evicted_peers >= 8)
                assert srv.server.client_count <= 4
                healthy_state(srv, token=token)
            finally:
                for sock in silent:
                    sock.close()


def test_counters_reach_reporter_stats() -> None:
    """What a server refused is visible in RankState.reporter (new fields, old ones kept)."""
    with serving() as srv:
        bad = raw_peer(srv.server.port)
        bad.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert closed_by_server(bad)
        bad.close()
        stats = ReporterStats()
        srv.server.fill_stats(stats)
        assert stats.rejected_peers == 1 and stats.dropped == 0 and stats.rate_limited == 0
    assert list(ReporterStats.__struct_fields__[:6]) == [
        "errors", "dropped", "samples", "clients", "last_error", "sample_cost_s"]


@pytest.mark.slow
def test_request_flood_on_a_real_rank(job_runner: JobRunner) -> None:
    """A local client flooding rank 0 without reading: the rank stays bounded and answers."""
    job = job_runner.start("healthy", nproc=2, env={"PROBE_SECONDS": "60"})
    snap = job.wait_ranks(2, timeout=90)
    rss_before = {r["rank"]: r["rss_bytes"] for r in snap["ranks"]}
    endpoint = next(e for e in discovery.read_entries() if e.job_id == job.job_id and e.rank == 0)
    floods = [Flooder(endpoint.port, seconds=45, token=job_token.read(job.job_id)) for _ in range(4)]
    try:
        assert settles(lambda: sum(f.sent_requests for f in floods) >= 20_000, timeout=20)
        step0 = next(r["step"] for r in job.snapshot()["ranks"] if r["rank"] == 0)
        # A real viewer still answers, and training goes on, while the flood runs.
        snap = job.wait_for(lambda s: len(s["ranks"]) == 2 and all(
            r["step"] >= step0 + 5 and r["reporter"]["rate_limited"] > 0
            for r in s["ranks"] if r["rank"] == 0), timeout=40)
        with RankConnection(endpoint, timeout=5) as conn:
            assert conn.state().state.rank == 0
    finally:
        for flood in floods:
            flood.stop()
    rank0 = next(r for r in snap["ranks"] if r["rank"] == 0)
    assert rank0["reporter"]["errors"] == 0, rank0["reporter"]["last_error"]
    # Rank 1 trains the same model unflooded: its growth is what training alone adds.
    growth = {r["rank"]: r["rss_bytes"] - rss_before[r["rank"]] for r in snap["ranks"]}
    assert growth[0] - growth[1] < 64 * 1024 * 1024, \
        f"rank 0 grew by {growth[0] >> 20} MiB under the flood, rank 1 by {growth[1] >> 20} MiB without"


def test_unsupported_message_after_auth_is_refused() -> None:
    """Only Requests are served after the handshake; the connection stays usable."""
    with serving() as srv, RankConnection(srv.endpoint, timeout=5) as conn:
        conn._send(ErrorMsg(reason="hi"))
        with pytest.raises(ProtocolError, match="ErrorMsg"):
            conn.state()
        assert conn.state().state.step == 7
