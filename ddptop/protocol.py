"""The ddptop wire vocabulary: typed msgspec structs, the same on sockets and in files.

Every struct here is public: the JSON of ``ddptop snapshot --json`` is these structs
encoded by msgspec, so field names are stable. Add fields (with defaults), never rename.

Messages travel as a tagged union (``Message``): the tag is the struct's ``type`` field.
This module imports only msgspec and the standard library; the reporter inside a
training rank depends on it.

Every struct is ``gc=False``: they hold plain data and never take part in a reference
cycle, and a viewer of 4096 ranks keeps millions of them (an hour of 1 Hz samples per
rank), which the cyclic garbage collector would otherwise walk on every full collection
(measured: 100-200 ms pauses of the dashboard).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

PROTOCOL_VERSION = 1
ENQUEUE_STRIDE = 8  # see CollectiveGroup.enqueue_times

# Length caps a decoder enforces before it builds anything: a frame of tiny list items
# (one byte each in msgpack, a 56-byte list or a 24-byte float each once decoded) must
# not turn one 16 MiB frame into gigabytes. Far above anything a reporter sends.
MAX_DIMS = 64  # dimensions of one tensor shape
MAX_ITEMS = 4096  # tensors of an op, groups, pending ops per group, threads, pids, env vars
MAX_SAMPLES = 100_000  # history samples in one frame
MAX_SHORT_TEXT = 256  # commands, nonces, proofs
Shape = Annotated[list[int], msgspec.Meta(max_length=MAX_DIMS)]

# Commands a viewer may send to a rank. A fixed, read-only set: nothing a viewer sends
# can change the training process.
# "news" is the node agents' exchange: only how ranks ended and where they are stuck, plus a
# beat of the agent itself (see ddptop.agent.exchange).
Command = Literal["state", "history", "stacks", "fr_trace", "subscribe", "unsubscribe", "news"]
COMMANDS: frozenset[str] = frozenset(
    ("state", "history", "stacks", "fr_trace", "subscribe", "unsubscribe", "news")
)


class PendingOp(msgspec.Struct, gc=False, kw_only=True):
    """One collective a rank entered and has not completed (from the Flight Recorder)."""

    seq: int
    op: str  # e.g. "gloo:all_gather", "nccl:_allgather_base"
    # [input_sizes, output_sizes]
    sizes: Annotated[list[Annotated[list[Shape], msgspec.Meta(max_length=MAX_ITEMS)]],
                     msgspec.Meta(max_length=2)] = []
    dtype: str = ""
    age_s: float = 0.0
    started_at: float = 0.0  # wall clock (epoch seconds) the op was enqueued
    timeout_s: float | None = None
    state: str = ""  # FR state: scheduled / started / completed
    # Point-to-point ops (send/recv) from a Flight Recorder: ``seq`` is then the group's
    # collective seq at the time, ``p2p_seq`` FR's p2p counter, ``peer`` the *global* rank at
    # the other end (None where it cannot be told).
    is_p2p: bool = False
    p2p_seq: int = 0
    peer: int | None = None


class CollectiveGroup(msgspec.Struct, gc=False, kw_only=True):
    """Sequence number and pending ops of one process group on one rank."""

    pg: str  # process group name ("0" is the default group)
    seq: int
    desc: str = ""
    size: int = 0
    backend: str = ""
    timeout_s: float | None = None
    pending: Annotated[list[PendingOp], msgspec.Meta(max_length=MAX_ITEMS)] = []
    seq_changed_at: float = 0.0  # wall clock of the last observed seq advance
    # (seq, wall clock the rank enqueued it) for seqs that are multiples of
    # ENQUEUE_STRIDE: every rank reports the same seqs, so a viewer can see which rank
    # enters each collective late (the straggler the others wait for).
    enqueue_times: Annotated[list[tuple[int, float]], msgspec.Meta(max_length=MAX_ITEMS)] = []
    # The last collectives the rank entered on this group, oldest first, from a fresh Flight
    # Recorder read: filled only in last words (exception, SIGTERM, exit), where a post-mortem
    # compares them across ranks to find the first seq at which they ran different ops.
    recent: Annotated[list[PendingOp], msgspec.Meta(max_length=MAX_ITEMS)] = []
    # The group's members as global ranks (FR's pg_config), empty where unknown: what lets a
    # post-mortem follow a wait from one group into another (a TP all-reduce waiting on a
    # rank that is itself stuck in a PP recv).
    ranks: Annotated[list[int], msgspec.Meta(max_length=1 << 17)] = []
    # The last seq FR saw completed on this group (pg_status), None where unknown.
    last_completed: int | None = None


class GpuInfo(msgspec.Struct, gc=False, kw_only=True):
    """The rank's GPU as NVML sees it (null fields where NVML cannot tell)."""

    index: int
    uuid: str = ""
    name: str = ""
    compute_capability: str = ""
    driver: str = ""
    util_percent: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    # peer GPU index -> NVML P2P status word
    p2p: Annotated[dict[str, str], msgspec.Meta(max_length=MAX_ITEMS)] = {}


class ParamFingerprint(msgspec.Struct, gc=False, kw_only=True):
    """Shape fingerprint of the model a rank wrapped in DDP/FSDP (never values)."""

    count: int  # number of parameter tensors
    numel: int  # total elements
    shapes_hash: str
    wrapper: str = ""  # DistributedDataParallel / FullyShardedDataParallel
    shapes: Annotated[list[tuple[str, Shape]], msgspec.Meta(max_length=MAX_ITEMS)] = []  # (name, shape)
    dtensors: int = 0  # parameters that are DTensors (FSDP2, TP): global shapes, placements hashed


class RngFingerprint(msgspec.Struct, gc=False, kw_only=True):
    """Short hashes of RNG states at an epoch start; equal hashes mean equal seeds."""

    epoch: int
    torch: str = ""
    numpy: str = ""
    python: str = ""


class Versions(msgspec.Struct, gc=False, kw_only=True):
    """Software stack of a rank: the first thing to compare when ranks disagree."""

    python: str = ""
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    driver: str | None = None
    ddptop: str = ""


class ReporterStats(msgspec.Struct, gc=False, kw_only=True):
    """What the reporter itself did: errors it swallowed and what it dropped."""

    errors: int = 0
    dropped: int = 0
    samples: int = 0
    clients: int = 0
    last_error: str = ""
    sample_cost_s: float = 0.0  # CPU time of the last sample, on the reporter thread
    # What the rank's server refused its peers (see ddptop.reporter.limits).
    dropped_replies: int = 0  # replies not queued: the peer asked without reading
    rate_limited: int = 0  # requests over the per-connection rate
    rejected_peers: int = 0  # garbage, wrong version, oversized frame, bad token
    evicted_peers: int = 0  # closed to make room for a newer connection
    timed_out_peers: int = 0  # handshake too slow, idle, or not reading


class WorkerCrash(msgspec.Struct, gc=False, kw_only=True):
    """A process forked from the rank (a DataLoader worker) that died of a fatal error."""

    pid: int
    worker_id: int | None = None  # index among the training loader's workers, when known
    signal: str = ""  # "Segmentation fault", "Killed"...
    # the faulting thread's frames, innermost first (faulthandler)
    stack: Annotated[list[str], msgspec.Meta(max_length=MAX_ITEMS)] = []
    crash_file: str = ""  # base name of its crash file on the rank's host


class StuckReport(msgspec.Struct, gc=False, kw_only=True):
    """Where a rank that stopped answering is stuck, read from outside by the node agent.

    Written to ``<job>.<rank>.stuck`` and recorded in the black box (inside a
    :class:`StacksMsg` whose ``source`` is not empty); viewers fill ``RankState.stuck``.
    """

    rank: int
    pid: int
    time: float  # wall clock of the capture
    since: float  # wall clock of the rank's last state: silent since then
    source: str  # how it was obtained: "py-spy", "faulthandler" or "proc"
    proc_state: str = ""  # /proc/PID/status State: "T (stopped)", "R (running)"...
    wchan: str = ""  # /proc/PID/wchan: the kernel function it sleeps in
    syscall: str = ""  # /proc/PID/syscall of the main thread ("running" or a number and args)
    # the main thread's Python frames, innermost last
    frames: Annotated[list[FrameStack], msgspec.Meta(max_length=MAX_ITEMS)] = []
    # the main thread's native frames, innermost first (py-spy --native)
    native: Annotated[list[str], msgspec.Meta(max_length=MAX_ITEMS)] = []
    holds_gil: bool | None = None  # the main thread holds the GIL (py-spy), when known
    note: str = ""  # why a better method was not used (py-spy failed, no signal handler...)


class LoaderInfo(msgspec.Struct, gc=False, kw_only=True):
    """One DataLoader object of a rank: its length and where its current pass is.

    ``role`` tells the training loader (its batches drive optimizer steps) from the
    others: ``train`` for the loader that fed the latest steps, ``eval`` for a loader
    that fed none while steps were counted, ``""`` while no step has been taken yet.
    """

    index: int  # order of first iteration on this rank (the same on every rank for the same code)
    name: str  # loader class (dataset class), e.g. "DataLoader(TensorDataset)"
    role: str = ""  # train / eval / "" (undecided: no optimizer step yet)
    length: int | None = None  # len(loader) on this rank at the start of its latest pass
    batch: int = 0  # batches taken in the current pass
    passes: int = 0  # passes started (iter() calls)
    passes_completed: int = 0  # passes that ran to StopIteration
    steps: int = 0  # optimizer steps its batches fed
    batch_size: int | None = None
    workers: int = 0
    worker_pids: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []
    ready_batches: int | None = None  # prefetched, unconsumed batches of its live iterator
    last_batch_at: float = 0.0  # wall clock of its latest batch


class RankState(msgspec.Struct, gc=False, kw_only=True):
    """Everything one rank reports, at one moment. The ``snapshot --json`` schema."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    job_id: str = ""
    status: str = "running"  # starting / running / exited / crashed (reporter's view)
    time: float = 0.0  # wall clock of this sample
    start_time: float = 0.0
    restart_count: int = 0
    # progress
    step: int = 0
    step_time_s: float | None = None  # mean of recent steps
    last_step_at: float = 0.0
    epoch: int = 0
    batch: int = 0
    batches_per_epoch: int | None = None
    data_wait_fraction: float | None = None
    loader_ready_batches: int | None = None
    loader_workers: int = 0
    loader_worker_pids: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []
    last_batch_at: float = 0.0
    # collectives
    backend: str = ""
    collectives: Annotated[list[CollectiveGroup], msgspec.Meta(max_length=MAX_ITEMS)] = []
    # system
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    threads: int | None = None
    load_avg: Annotated[list[float], msgspec.Meta(max_length=16)] = []
    cpu_count: int | None = None
    mem_available_bytes: int | None = None
    shm_used_bytes: int | None = None
    shm_total_bytes: int | None = None
    gpu: GpuInfo | None = None
    # environment and fingerprints
    versions: Versions = msgspec.field(default_factory=Versions)
    env: Annotated[dict[str, str], msgspec.Meta(max_length=MAX_ITEMS)] = {}
    param_fingerprint: ParamFingerprint | None = None
    rng_fingerprint: RngFingerprint | None = None
    crash_file: str = ""
    exit_reason: str = ""  # exception or signal the rank died of, when it told us
    reporter: ReporterStats = msgspec.field(default_factory=ReporterStats)
    # How the process ended, as the node agent (ddptop launch) saw it from outside: filled by
    # viewers from RankExit events, never by the rank itself.
    exit_code: int | None = None  # exit code, when it exited by itself
    exit_signal: str = ""  # "SIGSEGV", "SIGTERM"... when a signal ended it
    exited_at: float = 0.0  # wall clock of the exit, as the agent saw it
    exit_cause: str = ""  # "oom_kill": the kernel's OOM killer sent the SIGKILL (agent-filled)
    memory_limit_bytes: int | None = None  # its memory cgroup's limit at the exit (agent-filled)
    memory_peak_bytes: int | None = None  # that cgroup's peak use (agent-filled)
    # forked children that died (agent-filled)
    worker_crashes: Annotated[list[WorkerCrash], msgspec.Meta(max_length=MAX_ITEMS)] = []
    # every DataLoader this rank iterated (the fields above describe the training one)
    loaders: Annotated[list[LoaderInfo], msgspec.Meta(max_length=MAX_ITEMS)] = []
    # Where the rank is stuck while it does not answer, read from outside by the node agent:
    # filled by viewers (from the agent's .stuck file or black box), never by the rank itself.
    stuck: StuckReport | None = None


class Sample(msgspec.Struct, gc=False, kw_only=True, array_like=True):
    """One compact history point (1 Hz ring buffer); array_like keeps it small."""

    time: float
    step: int
    epoch: int
    batch: int
    seq: int
    step_time_s: float | None
    data_wait_fraction: float | None
    loader_ready_batches: int | None
    cpu_percent: float | None
    rss_bytes: int | None
    gpu_util_percent: float | None


class FrameStack(msgspec.Struct, gc=False, kw_only=True, array_like=True):
    """One Python frame: file, line, function."""

    file: str
    line: int
    function: str


class ThreadStack(msgspec.Struct, gc=False, kw_only=True):
    """The Python stack of one thread, innermost frame last (like a traceback)."""

    thread_id: int
    name: str
    frames: Annotated[list[FrameStack], msgspec.Meta(max_length=MAX_ITEMS)]
    is_main: bool = False


# ---------------------------------------------------------------- messages


class Hello(msgspec.Struct, gc=False, tag="hello", kw_only=True):
    """First frame a rank sends: who it is and whether it wants a token proof."""

    protocol: int
    role: str  # "rank", "agent" (a node agent serving its host's ranks) or "viewer"
    nonce: Annotated[str, msgspec.Meta(max_length=MAX_SHORT_TEXT)] = ""  # server challenge (hex)
    auth_required: bool = False
    rank: int | None = None
    job_id: str = ""


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
    interval_s: float = 1.0  # for "subscribe"


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
    status: str  # connected / stale / lost
    reason: str = ""


class AgentReply(msgspec.Struct, gc=False, tag="agent_reply", kw_only=True):
    """A node agent's answer to a request, for every rank it serves: the events a viewer
    would have got from each rank itself (``id`` is the request's, inside and out).

    ``time`` is the agent's wall clock when it answered: a viewer on another host moves the
    entries' times by its own clock's difference, so a silent rank stays silent for as long.
    """

    time: float
    entries: Annotated[list[RecordEntry | ConnectionEvent | RankExit], msgspec.Meta(max_length=MAX_ITEMS * 4)]
    id: int = 0


class AgentBeat(msgspec.Struct, gc=False, tag="agent_beat", kw_only=True):
    """A node agent's beat to the other agents of its job ("news"): it lives, which ranks it
    serves; ``ending`` when it closes because its part of the job ended (not a lost node)."""

    time: float
    host: str
    ranks: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []
    steps: Annotated[list[int], msgspec.Meta(max_length=MAX_ITEMS)] = []  # each rank's last step, as ranks
    ending: bool = False


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
)
