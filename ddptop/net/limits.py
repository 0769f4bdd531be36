"""Limits a rank's server puts on every peer, and the counts of what they cost peers.

A rank serves whoever can reach its port (on loopback without a token: any local
process). No peer may grow the rank's memory without bound, take its CPU, or keep a
real viewer out, so every connection is bounded in:

* output: state frames pushed to a subscriber are dropped beyond ``MAX_CLIENT_OUTPUT``;
  replies are never queued beyond ``MAX_REPLY_OUTPUT`` (dropped and counted), and while a
  peer's unread output exceeds ``PAUSE_READ_BYTES`` the server stops reading its
  requests, so TCP itself pushes back on a peer that asks without reading;
* rate: requests beyond a token bucket (``REQUEST_RATE`` a second, ``REQUEST_BURST`` at
  once) get a short refusal, or nothing if the peer is not reading;
* time: a peer must finish the handshake within ``HANDSHAKE_TIMEOUT_S``; a viewer that is
  not subscribed and silent for ``IDLE_TIMEOUT_S``, or that has read nothing of its
  queued output for ``STALL_TIMEOUT_S``, is closed;
* number: handshaking peers share a small pool (``MAX_PENDING``, the oldest evicted for a
  newcomer) apart from viewers (``MAX_CLIENTS``); a peer that completes the handshake
  always gets in, evicting the viewer that has been quiet the longest if the pool is full.

Module attributes, read at use, so tests can lower them.
"""

from __future__ import annotations

import selectors
import socket
from dataclasses import dataclass, field
from typing import Protocol

from ddptop.protocol import ReporterStats
from ddptop.wire import FrameBuffer

MAX_CLIENT_OUTPUT = 8 * 1024 * 1024  # broadcast frames beyond this are dropped
MAX_REPLY_OUTPUT = 4 * 1024 * 1024  # replies are not queued beyond this
PAUSE_READ_BYTES = 256 * 1024  # unread output above which a peer's requests are not read
MAX_TOTAL_OUTPUT = 64 * 1024 * 1024  # all peers of one server together
MAX_REQUEST_BYTES = 64 * 1024  # viewers only send small commands
RECV_BYTES = 16 * 1024  # read per wake-up: bounds the requests decoded at once
REQUEST_RATE = 20.0  # requests a second, per connection
REQUEST_BURST = 40.0
HANDSHAKE_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 120.0
STALL_TIMEOUT_S = 60.0
SWEEP_INTERVAL_S = 0.5
MAX_CLIENTS = 64  # viewers that completed the handshake
MAX_PENDING = 16  # connections still in the handshake
LISTEN_BACKLOG = 128
ACCEPTS_PER_WAKE = 8  # < MAX_PENDING: a newcomer is read before a burst can evict it


class TokenBucket:
    """Allow *rate* events a second on average, *burst* at once."""

    __slots__ = ("_burst", "_last", "_rate", "_tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self._rate, self._burst = rate, burst
        self._tokens, self._last = burst, now

    def take(self, now: float) -> bool:
        """Spend one token if there is one."""
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


@dataclass
class ServerCounters:
    """What a server refused, dropped or closed, for ``RankState.reporter``."""

    dropped_frames: int = 0  # state frames a slow subscriber did not get
    dropped_replies: int = 0  # replies not queued: the peer was not reading
    rate_limited: int = 0  # requests refused by the rate limit
    rejected_peers: int = 0  # garbage, wrong version, oversized frame, bad token
    evicted_peers: int = 0  # closed to make room for a newer connection
    timed_out_peers: int = 0  # handshake too slow, idle, or not reading
    read_pauses: int = 0  # times a peer's requests went unread while its output drained
    bytes_out: int = 0  # bytes sent to peers

    def fill(self, stats: ReporterStats) -> None:
        """Copy the counts into *stats* (the rank's reporter statistics)."""
        stats.dropped = self.dropped_frames
        stats.dropped_replies = self.dropped_replies
        stats.rate_limited = self.rate_limited
        stats.rejected_peers = self.rejected_peers
        stats.evicted_peers = self.evicted_peers
        stats.timed_out_peers = self.timed_out_peers


class PeerOwner(Protocol):
    """The server that serves a peer."""

    def serve_peer(self, client: Peer, events: int) -> None:
        """The selector saw *events* on *client*'s socket."""


@dataclass(eq=False)
class Peer:
    """One connection to a rank's server, and where it stands against every limit above."""

    owner: PeerOwner
    sock: socket.socket
    addr: str
    created: float  # monotonic
    bucket: TokenBucket
    inbuf: FrameBuffer = field(default_factory=lambda: FrameBuffer(limit=MAX_REQUEST_BYTES))
    out: bytearray = field(default_factory=bytearray)
    nonce: str = ""
    authed: bool = False
    admitted: bool = False  # handshake complete: counted among viewers, not pending peers
    subscribed: bool = False
    news: bool = False  # a node agent of the same job: only the exchange's events
    digest: bool = False  # a viewer of a node agent's digest lane (NodeDigest and the rare events)
    events: int = selectors.EVENT_READ  # what the selector watches for this socket
    last_request: float = 0.0  # monotonic
    last_drain: float = 0.0  # monotonic: output last emptied or made progress
    throttled_until: float = 0.0  # monotonic: requests unread until then (rate limit)

    def on_ready(self, events: int) -> None:
        """The selector saw *events* on this peer's socket."""
        self.owner.serve_peer(self, events)

    @property
    def streaming(self) -> bool:
        """It asked for a stream (states, news or the digest): quiet, yet not idle."""
        return self.subscribed or self.news or self.digest

    def wants(self, lane_only: bool, news: bool, digest: bool) -> bool:
        """Whether a broadcast is for this peer: the state stream unless the message belongs
        to a lane alone (*lane_only*), the news or the digest lane when sent to it."""
        return (self.subscribed and not lane_only) or (news and self.news) or (digest and self.digest)
