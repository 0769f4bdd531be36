"""Synthetic recordings and bundles for the bundle benchmark and tests (no ranks, no network).

The values come from ``ddptop.testing.synthetic.FakeRanks`` (the same pure value model the live
synthetic job serves, with a fake GPU each); this module only arranges them the way a
recorder or an export writes them, puts a realistic launcher environment in every state
(where tests plant canary secrets) and can crash one rank.
"""

from __future__ import annotations

import msgspec

from ddptop.protocol import FrTraceMsg, HistoryMsg, RankState, RecordEntry, StacksMsg, StateMsg
from ddptop.testing.synthetic import FakeRanks

JOB_ID = "synthetic"
BASE_ENV = {
    "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    "OMP_NUM_THREADS": "4", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "job-1234", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "0",
}


def _fake(world: int, t0: float) -> FakeRanks:
    # One sample a second and one step a second, like the 1 Hz recordings this stands for.
    return FakeRanks(world, JOB_ID, "healthy", 1.0, t0, fake_gpu=True, steps_per_s=1.0)


def _state(fake: FakeRanks, rank: int, tick: int, env: dict[str, str] | None,
           crashed: bool = False) -> RankState:
    """*fake*'s state of *rank* at *tick*, with the launcher environment (and a crash)."""
    state = fake.state(rank, tick)
    return msgspec.structs.replace(
        state, env={**state.env, **(env if env is not None else BASE_ENV)},
        status="crashed" if crashed else state.status, exit_reason="Segmentation fault" if crashed else "")


def recording_events(world: int, seconds: int, t0: float = 1_700_000_000.0,
                     env: dict[str, str] | None = None, crash_rank: int | None = None,
                     crash_at: int | None = None) -> list[RecordEntry]:
    """What a recorder receives: one state per rank per second; *crash_rank* may die at *crash_at*."""
    fake = _fake(world, t0)
    out: list[RecordEntry] = []
    for s in range(seconds):
        for rank in range(world):
            if crash_rank == rank and crash_at is not None and s > crash_at:
                continue
            state = _state(fake, rank, s, env, crashed=crash_rank == rank and crash_at == s)
            out.append(RecordEntry(time=state.time, rank=rank, message=StateMsg(state=state)))
    return out


def bundle_events(world: int, history: int, t: float = 1_700_000_600.0,
                  env: dict[str, str] | None = None) -> list[RecordEntry]:
    """What an export collects at *t*: per rank a state, *history* samples (at most the ring's 600),
    stacks and a Flight Recorder trace."""
    tick = max(0, history - 1)
    fake = _fake(world, t - tick - 1.0)  # every rank's sample *tick* falls in the second before *t*
    out: list[RecordEntry] = []
    for rank in range(world):
        for message in (StateMsg(state=_state(fake, rank, tick, env)),
                        HistoryMsg(rank=rank, samples=fake.history(rank, tick)),
                        StacksMsg(rank=rank, time=t, threads=fake.stacks(rank, tick)),
                        FrTraceMsg(rank=rank, time=t, json=fake.fr_json(rank, tick))):
            out.append(RecordEntry(time=t, rank=rank, message=message))
    return out
