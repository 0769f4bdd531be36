"""The ddptop wire vocabulary: typed msgspec structs, the same on sockets and in files.

Every struct here is public: the JSON of ``ddptop snapshot --json`` is these structs
encoded by msgspec, so field names are stable. Add fields (with defaults), never rename.

Messages travel as a tagged union (``Message``): the tag is the struct's ``type`` field.
This module imports only msgspec and the standard library; the reporter inside a
training rank depends on it.

A rank's state and its parts live in :mod:`ddptop.rank_state` and are re-exported here.

Every struct is ``gc=False``: they hold plain data and never take part in a reference
cycle, and a viewer of 4096 ranks keeps millions of them (an hour of 1 Hz samples per
rank), which the cyclic garbage collector would otherwise walk on every full collection
(measured: 100-200 ms pauses of the dashboard).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from ddptop.rank_state import (
    ENQUEUE_STRIDE,
    MAX_DIMS,
    MAX_ITEMS,
    MAX_SAMPLES,
    CollectiveGroup,
    FrameStack,
    GpuInfo,
    LoaderInfo,
    ParamFingerprint,
    PendingOp,
    RankState,
    ReporterStats,
    RngFingerprint,
    Sample,
    Shape,
    StuckReport,
    ThreadStack,
    Versions,
    WorkerCrash,
)

PROTOCOL_VERSION = 1
MAX_SHORT_TEXT = 256  # commands, nonces, proofs

# Commands a viewer may send to a rank. A fixed, read-only set: nothing a viewer sends
# can change the training process.
# "news" is the node agents' exchange: only how ranks ended and where they are stuck, plus a
# beat of the agent itself (see ddptop.agent.exchange).
# "digest" is a viewer asking a node agent for its compact lane (:class:`NodeDigest`, see
# ddptop.digest): only a server whose Hello listed it in ``features`` honours it.
COMMANDS: frozenset[str] = frozenset(
    ("state", "history", "stacks", "fr_trace", "subscribe", "unsubscribe", "news", "digest")
)
DIGEST_FEATURE = "digest"  # in Hello.features: this agent serves the "digest" command


class Hello(msgspec.Struct, gc=False, tag="hello", kw_only=True):
    """First frame a rank sends: who it is and whether it wants a token proof."""

    protocol: int
    role: str  # "rank", "agent" (a node agent serving its host's ranks) or "viewer"
    nonce: Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT)] = ""  # server challenge (hex)
    auth_required: bool = False
    rank: int | None = None
    job_id: str = ""
    # What this server offers beyond what every peer of this protocol version serves (a
    # node agent lists DIGEST_FEATURE). Older peers ignore the field: a viewer asks for a
    # feature only where it is listed, so an older server is never sent what it cannot parse.
    features: Annotated[list[Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT)]],
                        msgspec.Meta(max_length=64)] = []


# "No rank" where the wire carries an int: named once here, the value kept for old peers.
# A node agent serves many ranks, so its Hello names none (a viewer tells it by ``role``).
AGENT_HELLO_RANK = -1
# ``RankState.local_rank`` of a stand-in state that a viewer or an agent made for a rank it
# could not hear from (a rank's own states carry its LOCAL_RANK, never below 0).
STUB_LOCAL_RANK = -1


class AuthProof(msgspec.Struct, gc=False, tag="auth", kw_only=True):
    """Viewer's answer to the challenge: HMAC-SHA256(token, nonce) in hex, and its own
    challenge to the rank (``nonce``; empty from viewers that do not check the rank)."""

    mac: Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT)]
    nonce: Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT)] = ""


class AuthResult(msgspec.Struct, gc=False, tag="auth_result", kw_only=True):
    """Rank's verdict on the proof; on failure the rank closes the connection. On success,
    ``mac`` proves the rank knows the token too (over the viewer's nonce, see auth.py)."""

    ok: bool
    reason: Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT)] = ""
    mac: Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT)] = ""


class Request(msgspec.Struct, gc=False, tag="request", kw_only=True):
    """A read-only command from a viewer."""

    command: Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT)]
    id: int = 0
    # (An interval_s field was sent by older viewers and never read: msgspec ignores it.)
    # "state" / "history" / "digest" of a node agent: only these ranks (empty: every one it
    # serves). Detail on demand for one opened rank; an older server ignores it and answers
    # for all its ranks, which is only larger.
    ranks: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []


class StateMsg(msgspec.Struct, gc=False, tag="state", kw_only=True):
    """A rank's current state (answer to "state", and each tick of "subscribe")."""

    state: RankState
    id: int = 0


class HistoryMsg(msgspec.Struct, gc=False, tag="history", kw_only=True):
    """The rank's ring buffer of samples, oldest first."""

    rank: int
    samples: Annotated[list[Sample], msgspec.Meta(max_length=MAX_SAMPLES)]
    id: int = 0


class StacksMsg(msgspec.Struct, gc=False, tag="stacks", kw_only=True):
    """Every thread's Python stack at the moment of the request."""

    rank: int
    time: float
    threads: Annotated[list[ThreadStack], msgspec.Meta(max_length=MAX_ITEMS)]
    id: int = 0
    # "" when the rank answered itself; "py-spy", "faulthandler" or "proc" when the node agent
    # read the stacks from outside a rank that did not answer (then ``stuck`` says more).
    source: str = ""
    stuck: StuckReport | None = None

    @staticmethod
    def of_stuck(report: StuckReport) -> StacksMsg:
        """A stuck report as the stacks it carries (the main thread, read from outside): the
        one way the node agent's capture becomes a message, for the black box and viewers."""
        main = ThreadStack(thread_id=report.pid, name="MainThread", frames=list(report.frames), is_main=True)
        return StacksMsg(rank=report.rank, time=report.time, threads=[main], source=report.source,
                         stuck=report)


class FrTraceMsg(msgspec.Struct, gc=False, tag="fr_trace", kw_only=True):
    """The Flight Recorder dump as JSON text (never pickle), or why there is none."""

    rank: int
    time: float
    json: str = ""
    error: str = ""
    id: int = 0


class ErrorMsg(msgspec.Struct, gc=False, tag="error", kw_only=True):
    """The rank refused or failed a request; the connection stays usable."""

    reason: str
    id: int = 0


class RecordEntry(msgspec.Struct, gc=False, tag="record", kw_only=True):
    """A message as a recorder received it: the unit of recordings and bundles."""

    time: float  # viewer's wall clock at receipt
    rank: int
    message: StateMsg | HistoryMsg | StacksMsg | FrTraceMsg | ErrorMsg


class RankExit(msgspec.Struct, gc=False, tag="exit", kw_only=True):
    """A rank's process ended, as the node agent saw it from outside (it outlives the ranks).

    ``exit_code`` is the code of a process that exited by itself; ``signal`` the name of the
    signal that killed it ("SIGSEGV"). Both are empty when the process was reaped by someone
    else before the agent could read its status (then only "it is gone" is known).
    """

    time: float  # wall clock of the exit
    rank: int
    pid: int
    host: str = ""
    exit_code: int | None = None
    signal: str = ""
    # The kernel's word on a SIGKILL: "oom_kill" when the OOM killer ended it (the memory
    # cgroup's counter moved, or the kernel log names the pid), with that cgroup's limit and
    # peak use; "" where nothing says so.
    cause: str = ""
    memory_limit_bytes: int | None = None
    memory_peak_bytes: int | None = None


class ConnectionEvent(msgspec.Struct, gc=False, tag="conn", kw_only=True):
    """A viewer-side change of a rank's reachability (recorded so replay sees it)."""

    time: float
    rank: int
    # Status.CONNECTED, Status.LOST (closed), or Status.UNREACHABLE: the connection is open or
    # being opened but nothing came back for a while (a cut link, a dead switch, a hung host);
    # a viewer never records "stale": it is judged from time
    status: str
    reason: str = ""
    since: float = 0.0  # unreachable: when it was last heard from (0: never, by this viewer)
    # The host whose node agent gave this verdict (its exchange: that host's beats stopped),
    # "" for the viewer's own: "as host-a's agent saw it" in the finding, live or replayed
    seen_by: str = ""


# What happened to a rank, as a viewer, the node agent and a recording all carry it: the one
# event union (what a source emits, an agent forwards and a recording holds between frames).
Event = RecordEntry | ConnectionEvent | RankExit
EVENT_TYPES = (RecordEntry, ConnectionEvent, RankExit)  # for isinstance


class AgentReply(msgspec.Struct, gc=False, tag="agent_reply", kw_only=True):
    """A node agent's answer to a request, for every rank it serves: the events a viewer
    would have got from each rank itself (``id`` is the request's, inside and out).

    ``time`` is the agent's wall clock when it answered: a viewer on another host moves the
    entries' times by its own clock's difference, so a silent rank stays silent for as long.
    """

    time: float
    entries: Annotated[list[Event], msgspec.Meta(max_length=MAX_ITEMS * 4)]
    id: int = 0


class AgentBeat(msgspec.Struct, gc=False, tag="agent_beat", kw_only=True):
    """A node agent's beat to the other agents of its job ("news"): it lives, which ranks it
    serves; ``ending`` when it closes because its part of the job ended (not a lost node)."""

    time: float
    host: str
    ranks: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []
    steps: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []  # each rank's last step, as ranks
    ending: bool = False


class Pulse(msgspec.Struct, gc=False, array_like=True):
    """One rank's moving numbers at one sample, as a node agent's digest carries them: the
    fields :data:`ddptop.digest.PULSE_FIELDS` names. Applied to the rank's last detail (the
    full state numbered ``detail_no``) by :func:`ddptop.digest.merged`, it gives that sample's
    state exactly on every field a rule or a table column reads. array_like: about 100 bytes
    against a state frame's 1,300 (a digest carries one per rank per sample)."""

    rank: int
    heard_ago: float  # seconds before NodeDigest.time the agent received the state
    sample: Sample  # the history point, appended as is to the viewer's ring
    seqs: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []  # collectives[i].seq
    seq_changed_at: Annotated[list[float], msgspec.Meta(max_length=MAX_ITEMS)] = []
    last_step_at: float = 0.0
    gpu_mem_used_bytes: int | None = None
    shm_used_bytes: int | None = None
    load1: float | None = None  # load_avg[0]
    # every pending op's age_s, group by group in the detail's order (the ops are the detail's)
    pending_ages: Annotated[list[float], msgspec.Meta(max_length=MAX_ITEMS)] = []
    # group "0"'s enqueue milestones newer than the last pulse's, and how many the rank keeps
    enqueued: Annotated[list[tuple[int, float]], msgspec.Meta(max_length=MAX_ITEMS)] = []
    enqueue_kept: int = 0
    detail_no: int = 0  # which detail of this rank the pulse applies to (a gap: ask "state")
    # The rank's samples heard since the last digest before this one's own, oldest first: a
    # digest carries one pulse per rank and detail, and the samples between as history points
    # only (added after version 1's first agents: an older viewer ignores them, an older agent
    # sends none).
    earlier: Annotated[list[Sample], msgspec.Meta(max_length=MAX_ITEMS)] = []


class NodeSummary(msgspec.Struct, gc=False, kw_only=True):
    """A node agent's ranks at one digest: membership and liveness, counted by the agent."""

    host: str
    ranks: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []  # every rank it serves
    silent: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []  # not heard (status.silent_after_s)
    status_counts: Annotated[dict[str, int], msgspec.Meta(max_length=64)] = {}  # by each rank's own word
    dropped: int = 0  # events the agent's endpoint dropped so far (its queue overflowed)


class NodeDigest(msgspec.Struct, gc=False, tag="node_digest", kw_only=True):
    """One node, one interval, to a viewer that asked "digest" (never to any other peer: an
    older viewer would not know the tag): the summary, every pulse, and the full state of
    each rank whose detail key (:func:`ddptop.digest.detail_key`) changed."""

    time: float  # agent wall clock at sending (the viewer shifts by its own clock's difference)
    no: int  # digest counter of this connection's lane (a gap: one was dropped, resync)
    summary: NodeSummary
    # in the order they changed
    details: Annotated[list[RankState], msgspec.Meta(max_length=MAX_ITEMS * 4)] = []
    detail_nos: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS * 4)] = []  # each detail's number
    pulses: Annotated[list[Pulse], msgspec.Meta(max_length=MAX_ITEMS * 16)] = []  # oldest first


Message = (
    Hello
    | AuthProof
    | AuthResult
    | Request
    | StateMsg
    | HistoryMsg
    | StacksMsg
    | FrTraceMsg
    | ErrorMsg
    | RecordEntry
    | ConnectionEvent
    | RankExit
    | AgentReply
    | AgentBeat
    | NodeDigest
)

# The wire vocabulary is one namespace: a rank's state (ddptop.rank_state) is re-exported.
__all__ = [
    "AGENT_HELLO_RANK",
    "COMMANDS",
    "DIGEST_FEATURE",
    "ENQUEUE_STRIDE",
    "EVENT_TYPES",
    "MAX_DIMS",
    "MAX_ITEMS",
    "MAX_SAMPLES",
    "MAX_SHORT_TEXT",
    "PROTOCOL_VERSION",
    "STUB_LOCAL_RANK",
    "AgentBeat",
    "AgentReply",
    "AuthProof",
    "AuthResult",
    "CollectiveGroup",
    "ConnectionEvent",
    "ErrorMsg",
    "Event",
    "FrTraceMsg",
    "FrameStack",
    "GpuInfo",
    "Hello",
    "HistoryMsg",
    "LoaderInfo",
    "Message",
    "NodeDigest",
    "NodeSummary",
    "ParamFingerprint",
    "PendingOp",
    "Pulse",
    "RankExit",
    "RankState",
    "RecordEntry",
    "ReporterStats",
    "Request",
    "RngFingerprint",
    "Sample",
    "Shape",
    "StacksMsg",
    "StateMsg",
    "StuckReport",
    "ThreadStack",
    "Versions",
    "WorkerCrash",
]
