"""A live source's requests (stacks, Flight Recorder, fresh states) and their answers, per rank.

A request goes either to one rank (one future, one rank) or to a node agent (one future
for all the ranks it serves, answered by one :class:`~ddptop.protocol.AgentReply`):
:class:`LiveRequests` sends them on :class:`Peer` connections that the selector thread of
:class:`~ddptop.client.live.LiveSource` flushes; :func:`gather` waits for them all within
one deadline and splits every agent's answer into its ranks' parts, as if each rank had
answered itself.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from ddptop.client.agents import ClockOffset
from ddptop.client.collect import stuck_stacks
from ddptop.client.digest_view import DigestView
from ddptop.client.handshake import Handshake
from ddptop.net.loop import ServerLoop
from ddptop.protocol import AgentReply, FrTraceMsg, Message, RecordEntry, Request, StacksMsg, StateMsg
from ddptop.source import StacksResult, StatesResult
from ddptop.store.discovery import Endpoint
from ddptop.wire import FrameBuffer, encode_frame


@dataclass(eq=False)
class Peer:
    """One connection of a live source: to a rank, or to a node agent serving a few."""

    endpoint: Endpoint
    sock: socket.socket | None = None
    buf: FrameBuffer = field(default_factory=FrameBuffer)
    out: bytearray = field(default_factory=bytearray)
    ready: bool = False
    waiting: dict[int, Future[Message]] = field(default_factory=dict)
    heard_at: float = field(default_factory=time.monotonic)  # last state (or the connect)
    heard_wall: float = 0.0  # a node agent's peer: wall clock of the last thing it sent (0: none)
    connected: bool = False  # the connect completed (its host answered)
    unreachable: bool = False  # a node agent's peer: its ranks were told "unreachable"
    probe: Future[Message] | None = None  # a node agent's peer: the "ping" it was last sent
    stuck_time: float = 0.0  # time of the last outside report delivered for it
    handshake: Handshake | None = None  # of the current connection
    serves: tuple[int, ...] = ()  # a node agent's peer: the ranks it serves (empty for a rank)
    clock: ClockOffset = field(default_factory=ClockOffset)  # a node agent's peer: ours minus its
    owner: Callable[[Peer, int], None] | None = None  # serves the loop's events on this socket
    digest: DigestView | None = None  # a node agent's peer on its digest lane

    def on_ready(self, events: int) -> None:
        """The loop saw *events* on this peer's socket."""
        if self.owner is not None:
            self.owner(self, events)


class LiveRequests:
    """The requests half of :class:`~ddptop.client.live.LiveSource` (which sets these up)."""

    _peers: dict[int, Peer]  # ranks reached directly
    _via: dict[int, Peer]  # rank -> the node agent's peer that serves it
    _lock: threading.Lock  # guards peer output buffers and waiting futures
    _queued: set[int]  # ranks whose peer has output for the selector thread to flush
    _next_id: int
    _read_stuck: bool
    _loop: ServerLoop  # the selector thread's loop

    def _wake(self) -> None:
        self._loop.wake()

    def request_stacks(self, ranks: Sequence[int] | None = None, timeout: float = 5.0) -> StacksResult:
        """Every selected rank's stacks; ranks that fail are listed with why."""
        errors: dict[int, str] = {}
        replies = gather(self._request_all("stacks", ranks, errors), timeout, errors)
        return stacks_result(replies, errors, self._outside)

    def request_fr_traces(self, ranks: Sequence[int] | None = None,
                          timeout: float = 5.0) -> dict[int, FrTraceMsg]:
        """Flight Recorder dumps of the selected ranks (failures as FrTraceMsg.error)."""
        errors: dict[int, str] = {}
        return fr_traces(gather(self._request_all("fr_trace", ranks, errors), timeout, errors), errors)

    def request_states(self, ranks: Sequence[int], timeout: float = 5.0) -> StatesResult:
        """Fresh whole states of *ranks*: each node agent is asked once for the ones it serves
        (``Request.ranks``, so an opened rank costs one state, not its node's), a rank reached
        directly on its own connection. An agent's answer also replaces its digest lane's
        copies (:meth:`~ddptop.client.live.LiveSource._from_agent`): the states the dashboard
        folds carry the fresh on-demand fields from then on."""
        errors: dict[int, str] = {}
        answers = gather_timed(self._request_all("state", ranks, errors, narrow=True), timeout, errors,
                               StateMsg)
        return states_result(answers, errors)

    def on_demand_stale(self, rank: int) -> bool:
        """Whether *rank* comes through a node agent's digest lane, whose on-demand fields are
        only as fresh as the rank's last detail (:mod:`ddptop.digest`)."""
        peer = self._via.get(rank)
        return peer is not None and peer.digest is not None

    def _outside(self, rank: int) -> StacksMsg | None:
        # A rank that cannot answer: what the node agent read from outside (ranks reached
        # through an agent got that from the agent already).
        peer = self._peers.get(rank)
        return stuck_stacks(peer.endpoint) if peer is not None and self._read_stuck else None

    def _request_all(self, command: str, ranks: Sequence[int] | None, errors: dict[int, str],
                     narrow: bool = False) -> Asked:
        # *narrow*: a node agent is asked for the wanted ranks only (else for all it serves).
        futures: Asked = {}
        wanted = [*self._peers, *self._via] if ranks is None else list(ranks)
        by_agent: dict[int, list[int]] = {}  # one request per node agent, for all its ranks
        with self._lock:
            for rank in wanted:
                peer = self._peers.get(rank) or self._via.get(rank)
                if peer is None or peer.sock is None or not peer.ready:
                    errors[rank] = "not connected"
                elif peer.serves:
                    by_agent.setdefault(id(peer), []).append(rank)
                else:
                    futures[(rank,)] = self._ask(peer, command, rank)
            for served in by_agent.values():
                futures[tuple(served)] = self._ask(self._via[served[0]], command, served[0],
                                                   served if narrow else ())
        self._wake()
        return futures

    def _ask(self, peer: Peer, command: str, rank: int, only: Sequence[int] = ()) -> Future[Message]:
        # Under self._lock: queue one request on *peer*, flushed by the selector thread.
        self._next_id += 1
        fut: Future[Message] = Future()
        peer.waiting[self._next_id] = fut
        peer.out += encode_frame(Request(command=command, id=self._next_id, ranks=list(only)))
        self._queued.add(rank)
        return fut

    # ------------------------------------------------------------ the thread


Asked = dict[tuple[int, ...], Future[Message]]  # the ranks a request was for -> its answer


def gather(futures: Asked, timeout: float, errors: dict[int, str]) -> dict[int, Message]:
    """Every asked rank's answer; ranks without one go into *errors* with why."""
    return {rank: message for rank, (_at, message) in gather_timed(futures, timeout, errors).items()}


def gather_timed(futures: Asked, timeout: float, errors: dict[int, str],
                 want: type[Message] | None = None) -> dict[int, tuple[float, Message]]:
    """Every asked rank's answer and when it was taken (this viewer's clock); ranks without
    one go into *errors* with why. *want*: a rank's part of an agent's answer is the entry of
    that type (a "state" answer may carry a stuck rank's stacks beside its state)."""
    deadline = time.monotonic() + timeout
    replies: dict[int, tuple[float, Message]] = {}
    for asked, fut in futures.items():
        try:
            reply = fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            errors.update((r, f"no answer within {timeout:g} s") for r in asked)
            continue
        except Exception as exc:
            errors.update((r, str(exc) or type(exc).__name__) for r in asked)
            continue
        if isinstance(reply, AgentReply):  # each rank's part, as if it had answered itself
            # The entries' times were moved onto our clock when the reply was delivered
            # (LiveSource._from_agent): when the agent heard each rank.
            parts = {e.rank: (e.time, e.message) for e in reply.entries
                     if isinstance(e, RecordEntry) and (want is None or isinstance(e.message, want))}
            for rank in asked:
                if rank in parts:
                    replies[rank] = parts[rank]
                else:
                    errors[rank] = "its node agent had no answer from it"
        else:  # a rank's own answer: taken as it came
            replies.update((r, (time.time(), reply)) for r in asked)
    return replies


def stacks_result(replies: dict[int, Message], errors: dict[int, str],
                  outside: Callable[[int], StacksMsg | None]) -> StacksResult:
    """Stacks of the ranks that answered; a rank that could not gets what *outside* read of
    it (the node agent's report), else stays in the errors with why."""
    stacks = {r: m for r, m in replies.items() if isinstance(m, StacksMsg)}
    for r, m in replies.items():
        if not isinstance(m, StacksMsg):
            errors[r] = getattr(m, "reason", "unexpected reply")
    for r in list(errors):
        found = outside(r)
        if found is not None:
            stacks[r] = found
            del errors[r]
    return StacksResult(stacks, errors)


def fr_traces(replies: dict[int, Message], errors: dict[int, str]) -> dict[int, FrTraceMsg]:
    """Flight Recorder dumps; a rank without one gets a dump that says why (``error``)."""
    out = {r: m for r, m in replies.items() if isinstance(m, FrTraceMsg)}
    for r, why in errors.items():
        out[r] = FrTraceMsg(rank=r, time=time.time(), error=why)
    return out


def states_result(answers: dict[int, tuple[float, Message]], errors: dict[int, str]) -> StatesResult:
    """The states of the ranks that answered with one; any other answer is an error (why)."""
    states, taken = {}, {}
    for rank, (at, message) in answers.items():
        if isinstance(message, StateMsg):
            states[rank], taken[rank] = message.state, at
        else:
            errors[rank] = getattr(message, "reason", "") or f"unexpected reply {type(message).__name__}"
    return StatesResult(states, taken, errors)
