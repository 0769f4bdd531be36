"""The state of one rank as it travels: ``RankState`` and its parts, and the history sample.

Part of the wire vocabulary (:mod:`ddptop.protocol` re-exports every name here, and its
messages carry these structs): typed msgspec structs whose field names are public (the JSON
of ``ddptop snapshot --json``). Add fields (with defaults), never rename. Every struct is
``gc=False`` (plain data, never in a cycle; a viewer of 4096 ranks keeps millions of them).
Imports only msgspec and the standard library: the reporter inside a training rank uses it.

"Not known" has one spelling per kind of field, kept as the wire has always carried it: a
measurement nobody could take is ``None`` (shown as "-", never a made-up 0); a wall-clock
moment that has not happened yet (``last_step_at``, ``exited_at``...) is ``0.0``; a rank
number nobody told is ``protocol.STUB_LOCAL_RANK`` / ``AGENT_HELLO_RANK`` (-1).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

# Reporters before #57 sent only the seqs that are multiples of this; kept for readers of old
# bundles and for tests that build states the old way (see CollectiveGroup.enqueue_times).
ENQUEUE_STRIDE = 8

# Length caps a decoder enforces before it builds anything: a frame of tiny list items
# (one byte each in msgpack, a 56-byte list or a 24-byte float each once decoded) must
# not turn one 16 MiB frame into gigabytes. Far above anything a reporter sends.
MAX_DIMS = 64  # dimensions of one tensor shape
DISK_STEP_BYTES = 1 << 20  # a move of the checkpoint disk's use this big is a level of its own
DISK_LEVELS_KEPT = 32  # RankState.disk_levels: the newest kept (eight saves and more, rotated or kept)
MAX_ITEMS = 4096  # tensors of an op, groups, pending ops per group, threads, pids, env vars
MAX_SAMPLES = 100_000  # history samples in one frame
Shape = Annotated[list[int], msgspec.Meta(max_length=MAX_DIMS)]


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
    # (seq, wall clock the rank enqueued it), seq ascending, for the seqs the reporter's enqueue
    # timer saw move in its bursts: every rank bursts on the same wall-clock ticks and so reports
    # the same seqs, and a viewer sees which rank enters each collective late (the straggler the
    # others wait for).
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
    # The last collective FR saw this rank enqueue on the group (pg_status), None where unknown;
    # sent while the group stands still. Unlike ``seq`` it never counts point-to-point ops (gloo's
    # seq counts every send and recv), so it compares across the stages of a pipeline.
    enqueued: int | None = None


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
    """Shape fingerprint of the model a rank wrapped in DDP/FSDP/DeepSpeed (never values)."""

    count: int  # number of parameter tensors
    numel: int  # total elements
    shapes_hash: str
    wrapper: str = ""  # DistributedDataParallel / FullyShardedDataParallel
    shapes: Annotated[list[tuple[str, Shape]], msgspec.Meta(max_length=MAX_ITEMS)] = []  # (name, shape)
    dtensors: int = 0  # parameters that are DTensors (FSDP2, TP): global shapes, placements hashed
    # DeepSpeed (wrapper "DeepSpeedEngine"): the engine's ZeRO stage (0-3; None outside DeepSpeed),
    # the parameters this rank holds only a partition of (ZeRO-3; shapes, numel and the hash are
    # the global ones all the same), and the elements it holds (its partitions where partitioned).
    zero_stage: int | None = None
    partitioned: int = 0
    held_numel: int | None = None


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
    # The costliest sample after the first WARMUP samples (versions, environment, first reads):
    # how long the reporter thread held the training thread's GIL at most, in one go (#57).
    longest_sample_s: float = 0.0
    fr_full_reads: int = 0  # full Flight Recorder dumps read (only while a group stood still)
    timing_bursts: int = 0  # bursts of the enqueue timer (seq polls on shared wall-clock ticks)
    # What the rank's server refused its peers (see ddptop.net.limits).
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
    # New DataLoader objects that continued this one's passes over the same dataset and sampler
    # (DeepSpeed's engine loader builds one per pass): 0 for a loader iterated as it was built.
    rebuilt: int = 0


class RankState(msgspec.Struct, gc=False, kw_only=True):
    """Everything one rank reports, at one moment. The ``snapshot --json`` schema."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    job_id: str = ""
    status: str = "running"  # the reporter's view: starting / running / exited / crashed / terminated
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
    # resources heading for a limit (#48), read by the reporter; None where it cannot tell
    mem_total_bytes: int | None = None  # the host's memory
    cgroup_path: str = ""  # the memory cgroup whose limit binds the rank (its own or an ancestor's)
    cgroup_memory_bytes: int | None = None  # that cgroup's use (memory.current / usage_in_bytes)
    cgroup_memory_limit_bytes: int | None = None  # its limit (memory.max / limit_in_bytes); None: none
    disk_path: str = ""  # the directory the rank writes its large files to (checkpoints)
    disk_mount: str = ""  # the mount point of its filesystem
    disk_used_bytes: int | None = None  # used on that filesystem
    disk_total_bytes: int | None = None  # used + available to the rank (root's reserve left out)
    # (#55) that filesystem's use each time it moved by a step (DISK_STEP_BYTES or more), read
    # right after each torch.save and on the slow cadence: [wall clock, used bytes], the newest
    # DISK_LEVELS_KEPT. Growth in steps (checkpoints minutes apart) is forecast from it: the
    # samples a viewer's rules get cover too few seconds to see two saves.
    disk_levels: Annotated[list[tuple[float, int]], msgspec.Meta(max_length=MAX_ITEMS)] = []
    gpu_reserved_bytes: int | None = None  # torch's caching allocator, where CUDA is initialised
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
    # Where in the user's code the main thread is while the rank makes no progress (no step
    # for WHERE_AFTER_S): read in-process by the reporter (the interpreter's own frames: no
    # signal, no ptrace), its innermost frame outside torch, ddptop and the standard library;
    # None while it progresses.
    where: FrameStack | None = None


def kept_levels(levels: list[tuple[float, int]], now: float, used: int) -> list[tuple[float, int]]:
    """``RankState.disk_levels`` *levels* with (*now*, *used*) added where the use moved by
    DISK_STEP_BYTES or more since the newest kept (a new list then; the same one otherwise), the
    newest DISK_LEVELS_KEPT: the one way levels are kept (the reporter at each read of its disk,
    the simulated jobs of the tests and benches)."""
    if levels and abs(used - levels[-1][1]) < DISK_STEP_BYTES:
        return levels
    return [*levels[-(DISK_LEVELS_KEPT - 1):], (now, used)]


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
    # Added with the resource trends (#48): an older sample decodes with None
    cgroup_memory_bytes: int | None = None
    host_memory_used_bytes: int | None = None  # mem_total_bytes - mem_available_bytes
    shm_used_bytes: int | None = None
    disk_used_bytes: int | None = None
    gpu_mem_used_bytes: int | None = None

    @staticmethod
    def of(state: RankState, time: float) -> Sample:
        """The history point of *state* at *time*: the one way a sample is made (the reporter
        at each tick, a viewer from each state it folds)."""
        return Sample(
            time=time, step=state.step, epoch=state.epoch, batch=state.batch,
            seq=state.collectives[0].seq if state.collectives else 0, step_time_s=state.step_time_s,
            data_wait_fraction=state.data_wait_fraction, loader_ready_batches=state.loader_ready_batches,
            cpu_percent=state.cpu_percent, rss_bytes=state.rss_bytes,
            gpu_util_percent=state.gpu.util_percent if state.gpu else None,
            cgroup_memory_bytes=state.cgroup_memory_bytes,
            host_memory_used_bytes=(None if not state.mem_total_bytes or state.mem_available_bytes is None
                                    else state.mem_total_bytes - state.mem_available_bytes),
            shm_used_bytes=state.shm_used_bytes, disk_used_bytes=state.disk_used_bytes,
            gpu_mem_used_bytes=state.gpu.mem_used_bytes if state.gpu else None,
        )


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
