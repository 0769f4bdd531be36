"""Realistic synthetic jobs for the bundle benchmark and tests (no ranks, no network).

Builds the frames a recorder or an export of an N-rank job would write: states with an
environment, versions, GPU, collectives and fingerprints; 1 Hz histories; stacks; Flight
Recorder JSON. Optional canary secrets are planted in every rank's environment.
"""

from __future__ import annotations

import json
import logging
import random

from ddptop.protocol import (
    CollectiveGroup,
    FrameStack,
    FrTraceMsg,
    GpuInfo,
    HistoryMsg,
    ParamFingerprint,
    PendingOp,
    RankState,
    RecordEntry,
    Sample,
    StacksMsg,
    StateMsg,
    ThreadStack,
    Versions,
)

log = logging.getLogger(__name__)

BASE_ENV = {
    "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    "OMP_NUM_THREADS": "4", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "job-1234", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "0",
}


def rank_state(rank: int, world: int, t: float, step: int, env: dict[str, str] | None = None,
               status: str = "running", crashed: bool = False) -> RankState:
    """One plausible RankState of *rank* at wall clock *t*."""
    host = f"node-{rank // 8}"
    shapes = [(f"layers.{i}.weight", [512, 512]) for i in range(12)]
    pending = [PendingOp(seq=step + 1, op="nccl:allreduce", sizes=[[[512, 512]], [[512, 512]]],
                         dtype="Float", age_s=0.01, started_at=t, timeout_s=600.0, state="started")]
    return RankState(
        rank=rank, local_rank=rank % 8, world_size=world, host=host, pid=10000 + rank,
        job_id="synthetic", status="crashed" if crashed else status, time=t, start_time=t - step,
        step=step, step_time_s=0.98, last_step_at=t, epoch=step // 500, batch=step % 500,
        batches_per_epoch=500, data_wait_fraction=0.05, loader_ready_batches=4, loader_workers=4,
        loader_worker_pids=[20000 + rank * 4 + i for i in range(4)], backend="nccl",
        collectives=[CollectiveGroup(pg="0", seq=step, size=world, backend="nccl", timeout_s=600.0,
                                     pending=pending, seq_changed_at=t)],
        cpu_percent=95.0, rss_bytes=3 << 30, threads=40, load_avg=[8.1, 7.9, 7.5], cpu_count=96,
        mem_available_bytes=200 << 30, shm_used_bytes=1 << 30, shm_total_bytes=64 << 30,
        gpu=GpuInfo(index=rank % 8, uuid=f"GPU-{rank:08x}", name="NVIDIA H100 80GB HBM3",
                    compute_capability="9.0", driver="550.54", util_percent=97.0,
                    mem_used_bytes=60 << 30, mem_total_bytes=80 << 30, temperature_c=65.0, power_w=600.0),
        versions=Versions(python="3.11.9", torch="2.4.0", cuda="12.4", nccl="2.20.5", driver="550.54",
                          ddptop="0.1.0"),
        env=dict(env or BASE_ENV),
        param_fingerprint=ParamFingerprint(count=len(shapes), numel=12 * 512 * 512, shapes_hash="abc123",
                                           wrapper="DistributedDataParallel", shapes=shapes),
        exit_reason="Segmentation fault" if crashed else "",
    )


def samples(t_end: float, n: int) -> list[Sample]:
    """*n* one-second samples ending at *t_end*."""
    rnd = random.Random(int(t_end))
    return [Sample(time=t_end - n + i + 1, step=i, epoch=i // 500, batch=i % 500, seq=i,
                   step_time_s=0.95 + rnd.random() * 0.1, data_wait_fraction=0.05,
                   loader_ready_batches=4, cpu_percent=90.0 + rnd.random() * 10,
                   rss_bytes=(3 << 30) + i * 4096, gpu_util_percent=97.0) for i in range(n)]


def stacks(rank: int, t: float) -> StacksMsg:
    """A main thread inside an all-reduce, plus two helper threads."""
    frames = [FrameStack(file=f"/opt/app/train/module_{i}.py", line=10 + i, function=f"fn_{i}")
              for i in range(15)]
    threads = [ThreadStack(thread_id=1, name="MainThread", frames=frames, is_main=True),
               ThreadStack(thread_id=2, name="pin_memory", frames=frames[:5]),
               ThreadStack(thread_id=3, name="ddptop-reporter", frames=frames[:4])]
    return StacksMsg(rank=rank, time=t, threads=threads)


def fr_trace(rank: int, t: float, entries: int = 20) -> FrTraceMsg:
    """A Flight Recorder dump as JSON text."""
    doc = {"version": "2.4", "pg_config": {"0": {"desc": "default_pg", "ranks": "all"}},
           "entries": [{"record_id": i, "collective_seq_id": i, "profiling_name": "nccl:all_reduce",
                        "input_sizes": [[512, 512]], "output_sizes": [[512, 512]], "state": "completed",
                        "time_created_ns": int((t - entries + i) * 1e9)} for i in range(entries)]}
    return FrTraceMsg(rank=rank, time=t, json=json.dumps(doc))


def recording_events(world: int, seconds: int, t0: float = 1_700_000_000.0,
                     env: dict[str, str] | None = None, crash_rank: int | None = None,
                     crash_at: int | None = None) -> list[RecordEntry]:
    """What a recorder receives: one state per rank per second (optionally one crash)."""
    out: list[RecordEntry] = []
    for s in range(seconds):
        t = t0 + s
        for rank in range(world):
            if crash_rank == rank and crash_at is not None and s > crash_at:
                continue
            crashed = crash_rank == rank and crash_at == s
            st = rank_state(rank, world, t, s, env=env, crashed=crashed)
            out.append(RecordEntry(time=t + rank * 1e-4, rank=rank, message=StateMsg(state=st)))
    return out


def bundle_events(world: int, history: int, t: float = 1_700_000_600.0,
                  env: dict[str, str] | None = None) -> list[RecordEntry]:
    """What an export collects: per rank a state, its history, stacks and FR trace."""
    out: list[RecordEntry] = []
    for rank in range(world):
        out.append(RecordEntry(time=t, rank=rank, message=StateMsg(
            state=rank_state(rank, world, t, history, env=env))))
        out.append(RecordEntry(time=t, rank=rank, message=HistoryMsg(rank=rank, samples=samples(t, history))))
        out.append(RecordEntry(time=t, rank=rank, message=stacks(rank, t)))
        out.append(RecordEntry(time=t, rank=rank, message=fr_trace(rank, t)))
    return out
