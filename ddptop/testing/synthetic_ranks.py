"""The fake ranks' values: what rank r reports at tick k, a pure function of (seed, rank, k).

Nothing here opens a socket: :mod:`ddptop.testing.synthetic` serves these values through
real servers, :mod:`ddptop.testing.synthetic_agents` through fake node agents. Because every
value is recomputed from (seed, rank, tick), runs are reproducible and no rank's history
needs storing (4096 rings of 600 samples would cost ~700 MB).

Ranks are grouped in nodes of ``per_node`` consecutive ranks (the host ``synthNNNN``): a
node's ranks sample together and nodes are spread over the interval, so a generator
schedules one slot per node and tick, not one per rank (32,768 rank slots a second would
cost a Python loop of their own).
"""

from __future__ import annotations

import json
import math
import os
import sys

from msgspec.structs import replace

from ddptop import protocol as proto
from ddptop._version import __version__
from ddptop.protocol import RankState, Sample, StuckReport
from ddptop.status import silent_after_s

__all__ = ["BUCKETS", "HISTORY_LEN", "SCENARIOS", "FakeRanks"]

# Scenarios with an event at t0 + desync_after_s: desync and hang freeze the job there, silent
# stops the odd rank's states there (stall freezes it from the start, lost is the generator's).
EVENT_SCENARIOS = ("desync", "hang", "silent")
OUTSIDE_READ_S = 0.5  # how long the fake agent's read from outside takes once the rank is silent
_STUCK_IN = [("/workspace/ops.py", 12, "fused_attention")]  # below model.forward: a custom op

SCENARIOS = ("healthy", "desync", "stall", "lost", "hang", "silent")
HISTORY_LEN = 600  # samples a rank keeps, like the reporter's ring
BUCKETS = 3  # DDP all_reduce buckets per step: seq advances this much per step
BATCHES_PER_EPOCH = 240
GIB = 1 << 30
_MASK = (1 << 64) - 1
_TORCH = "/opt/conda/lib/python3.11/site-packages/torch/"
_TRAIN = "/workspace/train.py"
_MAIN = [(_TRAIN, 96, "<module>"), (_TRAIN, 88, "main")]
_BACKWARD = [(_TRAIN, 41, "train_epoch"), (_TORCH + "_tensor.py", 521, "backward"),
             (_TORCH + "autograd/__init__.py", 289, "backward"),
             (_TORCH + "autograd/graph.py", 768, "_engine_run_backward")]
_BUSY = [
    _BACKWARD,
    [(_TRAIN, 38, "train_epoch"), (_TORCH + "nn/modules/module.py", 1553, "_call_impl"),
     (_TORCH + "nn/parallel/distributed.py", 1636, "forward"), ("/workspace/model.py", 27, "forward")],
    [(_TRAIN, 35, "train_epoch"), (_TORCH + "utils/data/dataloader.py", 630, "__next__"),
     (_TORCH + "utils/data/dataloader.py", 1328, "_next_data"), ("/usr/lib/python3.11/queue.py", 180, "get")],
    [(_TRAIN, 43, "train_epoch"), (_TORCH + "optim/optimizer.py", 484, "wrapper"),
     (_TORCH + "optim/sgd.py", 75, "step")],
]
_C10D = _TORCH + "distributed/distributed_c10d.py"
_ALL_REDUCE = [*_BACKWARD, (_C10D, 2501, "all_reduce")]
_ALL_GATHER = [(_TRAIN, 57, "save_checkpoint"), (_C10D, 2768, "all_gather_object"),
               (_C10D, 3007, "all_gather")]
_BROADCAST = [(_TRAIN, 30, "setup"), (_TORCH + "nn/parallel/distributed.py", 825, "__init__"),
              (_TORCH + "distributed/utils.py", 283, "_sync_module_states"), (_C10D, 1990, "broadcast")]
_PIN = [("/usr/lib/python3.11/threading.py", 1002, "_bootstrap"),
        (_TORCH + "utils/data/_utils/pin_memory.py", 53, "_pin_memory_loop"),
        ("/usr/lib/python3.11/queue.py", 180, "get")]


def _mixed(key: tuple[int, ...]) -> int:
    """64 well-mixed bits from *key*: its hash (pure for ints, whatever PYTHONHASHSEED says)
    and one multiply-xorshift round, which takes out the tuple hash's correlation between
    neighbouring values (0.15 -> under 0.01)."""
    x = hash(key) & _MASK
    x = ((x ^ (x >> 32)) * 0xD6E8FEB86659FD93) & _MASK
    return x ^ (x >> 32)


def _noise(seed: int, rank: int, tick: int, salt: int) -> float:
    """Deterministic uniform [0, 1) from its arguments, no state. Half the cost of splitmix64
    in Python (0.9 vs 2.0 us), and a 32,768-rank generator calls it 250,000 times a second."""
    return (_mixed((seed, rank, tick, salt)) >> 11) / 9007199254740992.0  # 2 ** 53


def _draws(seed: int, rank: int, tick: int) -> tuple[float, float, float, float]:
    """Four uniform [0, 1) draws of 16 bits for one rank and tick, from one :func:`_mixed`: the
    four values a sample varies by (step time, data wait, loader queue, CPU), measured
    uncorrelated (|r| < 0.02 between them, across ticks and across ranks)."""
    x = _mixed((seed, rank, tick))
    return ((x >> 48) / 65536.0, ((x >> 32) & 0xFFFF) / 65536.0, ((x >> 16) & 0xFFFF) / 65536.0,
            (x & 0xFFFF) / 65536.0)


class FakeRanks:
    """What each fake rank reports at tick k: every value derived from (seed, rank, k)."""

    def __init__(self, n_ranks: int, job_id: str, scenario: str, interval_s: float, t0: float,
                 seed: int = 0, fake_gpu: bool = False, steps_per_s: float = 2.0,
                 desync_after_s: float = 3.0, per_node: int = 8) -> None:
        self.n, self.job_id, self.scenario, self.interval, self.t0 = n_ranks, job_id, scenario, interval_s, t0
        self.per_node = max(1, per_node)
        self.n_nodes = (n_ranks + self.per_node - 1) // self.per_node
        self.seed, self.fake_gpu, self.rate = seed, fake_gpu, steps_per_s
        # The rank that misbehaves in desync / lost / hang / silent: never rank 0, chosen by the seed.
        self.odd_rank = 1 + int(_noise(seed, 0, 0, 99) * (n_ranks - 1)) if n_ranks > 1 else 0
        self.event_at = t0 + desync_after_s if scenario in EVENT_SCENARIOS else None
        self.freeze_at = {"desync": self.event_at, "hang": self.event_at, "stall": t0}.get(scenario)
        self.frozen_steps = int(desync_after_s * steps_per_s) if scenario in ("desync", "hang") else 0
        self.backend = "nccl" if fake_gpu else "gloo"
        self.timeout_s = 600.0 if fake_gpu else 1800.0
        self.pid = os.getpid()
        self._versions = proto.Versions(python=sys.version.split()[0], torch="2.4.0+synthetic",
                                  cuda="12.4" if fake_gpu else None, ddptop=__version__)
        # What stays with a rank for the whole run, computed once (0.6 ms per 1,000 ranks): how
        # far behind its peers it runs (a DDP job's ranks are within a step of each other) and
        # its data-wait level.
        self._skew = [0.3 * _noise(seed, r, 0, 1) for r in range(n_ranks)]
        self._wait = [0.02 + 0.08 * _noise(seed, r, 0, 3) for r in range(n_ranks)]
        self._fingerprint = proto.ParamFingerprint(count=161, numel=25_557_032, shapes_hash="5ynth371c0ffee",
                                             wrapper="DistributedDataParallel")
        # What every rank's state has in common (state() sets the rest); never written to.
        # Host names per node and environments per rank (lazily), made once: a 32,768-rank
        # generator makes a state of each rank a second, and the catch-up of each at an attach.
        self._hosts = [f"synth{node:04d}" for node in range(self.n_nodes)]
        self._envs: dict[int, dict[str, str]] = {}
        self._template = RankState(
            rank=0, local_rank=0, world_size=n_ranks, host="", pid=self.pid, job_id=job_id, status="running",
            time=t0, start_time=t0, loader_workers=4, backend=self.backend, threads=26,
            load_avg=[7.9, 8.0, 8.1], cpu_count=64, mem_available_bytes=180 * GIB, shm_used_bytes=256 << 20,
            shm_total_bytes=32 * GIB, versions=self._versions, param_fingerprint=self._fingerprint,
            # the limits the resource trends read (#48): a node's cgroup, its memory, the checkpoints' disk
            mem_total_bytes=256 * GIB, cgroup_path="/synthetic.slice", cgroup_memory_limit_bytes=240 * GIB,
            disk_path="/ckpt/run", disk_mount="/ckpt", disk_total_bytes=8192 * GIB)

    def node_of(self, rank: int) -> int:
        """The node (host) *rank* runs on."""
        return rank // self.per_node

    def node_ranks(self, node: int) -> range:
        """The ranks of *node*."""
        return range(node * self.per_node, min(self.n, (node + 1) * self.per_node))

    def node_due(self, node: int, tick: int) -> float:
        """Wall-clock time of *node*'s samples *tick*: nodes are spread over the interval, like
        real ones (whose ranks sample on their own clocks); a node's ranks sample together."""
        return self.t0 + (tick + node / self.n_nodes) * self.interval

    def due(self, rank: int, tick: int) -> float:
        """Wall-clock time of *rank*'s sample *tick*."""
        return self.node_due(rank // self.per_node, tick)

    def host(self, rank: int) -> str:
        """The host name of *rank*'s node."""
        return self._hosts[rank // self.per_node]

    def _env(self, rank: int) -> dict[str, str]:
        # A rank's environment never changes: built once, shared by its states (never written to).
        env = self._envs.get(rank)
        if env is None:
            env = self._envs[rank] = {
                "RANK": str(rank), "WORLD_SIZE": str(self.n), "LOCAL_RANK": str(rank % 8),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "DDPTOP_SYNTHETIC": "1"}
        return env

    def bpe(self, rank: int) -> int:
        """batches_per_epoch of *rank* (the odd rank's differs in the desync scenario)."""
        odd = self.scenario == "desync" and rank == self.odd_rank
        return BATCHES_PER_EPOCH - 7 if odd else BATCHES_PER_EPOCH

    def issued_at(self, rank: int, seq: int) -> float:
        """When *rank* entered collective *seq* while running (ranks skew by up to 0.3 steps)."""
        return self.t0 + (self._skew[rank] + (seq - 1) / BUCKETS) / self.rate

    def _hung_outside(self, rank: int) -> bool:
        # hang: the odd rank stopped short of the collective its peers wait in (no pending op).
        return self.scenario == "hang" and rank == self.odd_rank

    def _waits(self, rank: int, t: float) -> bool:
        """Whether *rank* sits in a collective at *t* (the job froze and it is not the hang's odd rank)."""
        return self.freeze_at is not None and t >= self.freeze_at and not self._hung_outside(rank)

    def _progress(self, rank: int, t: float) -> tuple[float, int, bool]:
        """(fractional steps done, seq, waiting in a collective) of *rank* at time *t*."""
        if self.freeze_at is not None and t >= self.freeze_at:
            top = 2 + self.frozen_steps * BUCKETS if self.frozen_steps else 1
            if self._hung_outside(rank):  # its seq stays one short: S-1 while its peers wait in #S
                return float(self.frozen_steps), top - 1, False
            return float(self.frozen_steps), top, True
        p = max(0.0, (t - self.t0) * self.rate - self._skew[rank])
        if self.freeze_at is not None:
            p = min(p, self.frozen_steps - 1e-6)
        return p, 1 + int(p * BUCKETS), False

    def sample(self, rank: int, tick: int) -> Sample:
        """The history point of *rank* at *tick*."""
        t = self.due(rank, tick)
        p, seq, frozen = self._progress(rank, t)
        step, bpe = int(p), self.bpe(rank)
        step_u, wait_u, loader_u, cpu_u = _draws(self.seed, rank, tick)
        return Sample(
            time=t, step=step, epoch=step // bpe, batch=step % bpe, seq=seq,
            step_time_s=None if step == 0 else (0.95 + 0.1 * step_u) / self.rate,
            data_wait_fraction=round(self._wait[rank] + 0.02 * wait_u, 4),
            loader_ready_batches=8 if frozen else int(5 * loader_u),
            cpu_percent=round((100.0 if self.fake_gpu else 3.0 + 2 * cpu_u) if frozen else 97.0 + 6 * cpu_u,
                              1),
            rss_bytes=int(2.1 * GIB) + (rank % 8) * 50_000_000 + step * 4096,
            gpu_util_percent=(100.0 if frozen else round(80 + 18 * _noise(self.seed, rank, tick, 7), 1))
            if self.fake_gpu else None,
            # the node's ranks and their sawtooth, level: what a healthy job's resources look like
            cgroup_memory_bytes=int((20 + 4 * wait_u) * GIB),
            host_memory_used_bytes=int((76 + 4 * wait_u) * GIB),
            shm_used_bytes=256 << 20, disk_used_bytes=2048 * GIB,
        )

    def pending(self, rank: int, t: float, seq: int) -> list[proto.PendingOp]:
        """The op *rank* waits in once frozen (same seq everywhere; the odd rank in another op)."""
        if not self._waits(rank, t) or self.freeze_at is None:
            return []
        return [proto.PendingOp(seq=seq, op=f"{self.backend}:{self._op(rank, seq)}",
                                sizes=[[[1048576]], [[1048576]]],
                          dtype="Float", age_s=round(t - self.freeze_at, 3), started_at=self.freeze_at,
                          timeout_s=self.timeout_s, state="started" if self.fake_gpu else "scheduled")]

    def _op(self, rank: int, seq: int) -> str:
        if seq == 1:
            return "broadcast"
        frozen_here = self.scenario == "desync" and seq == 2 + self.frozen_steps * BUCKETS
        return "all_gather" if frozen_here and rank == self.odd_rank else "all_reduce"

    def state(self, rank: int, tick: int, clients: int = 0, sample: Sample | None = None) -> RankState:
        """The full RankState of *rank* at *tick*; *sample*: ``sample(rank, tick)``, if the caller
        has it already (a catch-up computes the history up to it first)."""
        s = sample if sample is not None else self.sample(rank, tick)
        frozen = self._waits(rank, s.time)
        step_at = self.t0 + (self._skew[rank] + s.step) / self.rate if s.step else 0.0
        seq_at = self.freeze_at if frozen and self.freeze_at else self.issued_at(rank, s.seq)
        gpu = None
        if self.fake_gpu:
            gpu = proto.GpuInfo(index=rank % 8, uuid=f"GPU-5y{rank:06d}", name="Fake H100 80GB HBM3",
                          compute_capability="9.0", driver="550.54", util_percent=s.gpu_util_percent,
                          mem_used_bytes=61 * GIB + rank % 8 * 10_000_000, mem_total_bytes=80 * GIB,
                          temperature_c=60.0 + round(10 * _noise(self.seed, rank, tick, 8)), power_w=500.0)
        # The template's fields that stay, the rank's and the tick's over them: a copy with 20
        # fields set costs a third of a RankState built from its 45 (8 us a state at 32,768
        # ranks, every second, while a viewer follows the job).
        return replace(
            self._template, rank=rank, local_rank=rank % 8, host=self.host(rank), time=s.time, step=s.step,
            step_time_s=s.step_time_s, last_step_at=step_at, epoch=s.epoch, batch=s.batch,
            batches_per_epoch=self.bpe(rank), data_wait_fraction=s.data_wait_fraction,
            loader_ready_batches=s.loader_ready_batches, last_batch_at=step_at,
            collectives=[proto.CollectiveGroup(pg="0", seq=s.seq, desc="default_pg", size=self.n,
                                               backend=self.backend, timeout_s=self.timeout_s,
                                               pending=self.pending(rank, s.time, s.seq),
                                               seq_changed_at=seq_at)],
            cpu_percent=s.cpu_percent, rss_bytes=s.rss_bytes, gpu=gpu,
            cgroup_memory_bytes=s.cgroup_memory_bytes, disk_used_bytes=s.disk_used_bytes,
            env=self._env(rank),
            reporter=proto.ReporterStats(samples=tick + 1, clients=clients, sample_cost_s=0.0004),
        )

    def stacks(self, rank: int, tick: int) -> list[proto.ThreadStack]:
        """Plausible Python stacks: busy ranks rotate through phases, frozen ones sit in their op."""
        s = self.sample(rank, tick)
        if self._waits(rank, s.time):
            op = self._op(rank, s.seq)
            frames = _BROADCAST if op == "broadcast" else _ALL_GATHER if op == "all_gather" else _ALL_REDUCE
        elif self.freeze_at is not None and s.time >= self.freeze_at:  # hang: waits for data, forever
            frames = _BUSY[2]
        else:
            frames = _BUSY[int(4 * _noise(self.seed, rank, tick, 9))]
        main = [proto.FrameStack(file=f, line=ln, function=fn) for f, ln, fn in (_MAIN + frames)]
        pin = [proto.FrameStack(file=f, line=ln, function=fn) for f, ln, fn in _PIN]
        return [proto.ThreadStack(thread_id=1400000 + rank, name="MainThread", frames=main, is_main=True),
                proto.ThreadStack(thread_id=1500000 + rank, name="Thread-1 (_pin_memory_loop)", frames=pin)]

    def fr_json(self, rank: int, tick: int) -> str:
        """A Flight Recorder dump (torch's JSON layout) of the last few collectives of *rank*."""
        s = self.sample(rank, tick)
        frozen = self._waits(rank, s.time)
        entries = []
        for i, seq in enumerate(range(max(1, s.seq - 5), s.seq + 1)):
            waiting = frozen and seq == s.seq
            created = self.freeze_at if waiting and self.freeze_at else self.issued_at(rank, seq)
            entries.append({
                "record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"],
                "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
                "profiling_name": f"{self.backend}:{self._op(rank, seq)}",
                "time_created_ns": int(created * 1e9), "input_sizes": [[1048576]], "input_dtypes": ["Float"],
                "output_sizes": [[1048576]], "output_dtypes": ["Float"],
                "state": ("started" if self.fake_gpu else "scheduled") if waiting else "completed",
                "retired": not waiting and i < 4, "timeout_ms": int(self.timeout_s * 1000), "is_p2p": False,
            })
        done = s.seq - 1 if frozen else s.seq
        return json.dumps({
            "version": "2.4",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": f"[0..{self.n - 1}]"}},
            "pg_status": {"0": {"last_enqueued_collective": s.seq, "last_started_collective": s.seq,
                                "last_completed_collective": done}},
            "entries": entries,
        })

    def heard_tick(self, rank: int, tick: int) -> int:
        """The tick of *rank*'s last state by *tick*: *tick*, except for the silent rank, whose
        states stop at the event (its last is the last sample before it)."""
        if self.scenario != "silent" or rank != self.odd_rank or self.event_at is None:
            return tick
        last = math.ceil((self.event_at - self.t0) / self.interval - self.node_of(rank) / self.n_nodes) - 1
        return min(tick, max(0, last))

    def stuck_report(self, rank: int, now: float) -> StuckReport | None:
        """Where the silent rank is stuck, as its node agent reads it from outside once the rank
        has been silent for ``status.silent_after_s`` (None before then, and for any other rank)."""
        if self.scenario != "silent" or rank != self.odd_rank or self.event_at is None:
            return None
        since = self.due(rank, self.heard_tick(rank, 1 << 40))
        at = since + silent_after_s(self.interval) + OUTSIDE_READ_S
        if now < at:
            return None
        where = _MAIN + _BUSY[1] + _STUCK_IN
        frames = [proto.FrameStack(file=f, line=ln, function=fn) for f, ln, fn in where]
        return StuckReport(rank=rank, pid=self.pid, time=at, since=since, source="py-spy",
                           proc_state="R (running)", frames=frames, holds_gil=True,
                           note="synthetic: a C extension that keeps the GIL")

    def history(self, rank: int, tick: int) -> list[Sample]:
        """The last HISTORY_LEN samples up to *tick*, recomputed (they are pure)."""
        return [self.sample(rank, k) for k in range(max(0, tick - HISTORY_LEN + 1), tick + 1)]
