"""Hangs whose waits pass through several groups: a 2-D mesh, a pipeline, a deadlock (#45).

Four ranks on gloo (two for ``deadlock``), one planted culprit each (PROBE_SCENARIO), at step
PROBE_AT (default 6), bounded by PROBE_SECONDS; the culprit is released by ``$PROBE_RELEASE``:

* ``hsdp_stall``: FSDP2 on a 2x2 mesh (replicate x shard: HSDP). Rank 3 sleeps in Python
  inside its backward pass (a gradient hook). Rank 2 waits for it in the shard group's
  reduce-scatter, rank 0 for rank 2 in the replicate group's all-reduce, rank 1 for rank 0
  in the shard group {0, 1}: every wait ends at rank 3.
* ``hsdp_killed``: rank 3 is SIGKILLed (by itself) in its backward pass instead.
* ``pipeline_stuck``: four stages, activations sent forward and gradients back with blocking
  ``send``/``recv``, an all-reduce of a metric every 10 steps. Stage 2 spins in a Python
  retry loop before its forward: stage 3 waits in recv from 2, stage 1 in recv from 2 (the
  gradient), stage 0 in recv from 1.
* ``pipeline_killed``: stage 2 is SIGKILLed (by itself) at that step instead.
* ``tpdp_skip``: tensor x data parallel 2x2 (tp {0,1} {2,3}, dp {0,2} {1,3}); each step a tp
  all-reduce, a tp all-gather, a dp all-reduce; rank 1 skips its tp all-reduce at that step.
* ``deadlock``: two groups of the same two ranks; at that step rank 0 calls group A's
  all-reduce then group B's, rank 1 the other way round: each waits for the other.

With PROBE_DUMP_PREFIX set, every live rank writes its Flight Recorder dump with torch's own
writer (tests' fr_writer) once it has waited PROBE_DUMP_AFTER_S, as NCCL's watchdog would.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
AT = int(os.environ.get("PROBE_AT", "6"))
STEPS = int(os.environ.get("PROBE_STEPS", "1000000"))


def linger(end: float, what: str) -> None:
    """Stay here (Python, holding nothing) until released or the probe's time is up."""
    print(f"rank {dist.get_rank()}: {what}", flush=True)
    release = os.environ.get("PROBE_RELEASE", "")
    while not (release and os.path.exists(release)) and time.monotonic() < end:
        time.sleep(0.02)  # a retry loop: try again, and again


def dump_when_stuck(rank: int) -> None:
    """Write this rank's FR dump after PROBE_DUMP_AFTER_S, then end it (the watchdog's part)."""
    prefix = os.environ.get("PROBE_DUMP_PREFIX")
    if not prefix:
        return

    def later() -> None:
        from fr_writer import dump

        time.sleep(float(os.environ.get("PROBE_DUMP_AFTER_S", "4")))
        dump(prefix, rank, os.environ.get("PROBE_DUMP_FORMAT", "pickle"))
        os._exit(0)

    threading.Thread(target=later, daemon=True, name="fr-dump").start()


def die(what: str) -> None:
    """SIGKILL this rank (no last words: the OOM killer's way)."""
    print(f"rank {dist.get_rank()}: {what}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def hsdp(rank: int, end: float, killed: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x = torch.randn(8, 16)
        out = model(x)
        if rank == 3 and step == AT and killed:
            out.register_hook(lambda grad: (die(f"step {AT}: killing myself in backward"), grad)[1])
        elif rank == 3 and step == AT:
            out.register_hook(lambda grad: (linger(end, f"step {AT}: lingering in backward"), grad)[1])
            dump_when_stuck(rank)
        elif step == AT:
            dump_when_stuck(rank)
        out.sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.05)


def pipeline(rank: int, end: float, killed: bool) -> None:
    world = dist.get_world_size()
    act = torch.zeros(64)
    for step in range(STEPS):
        if step == AT:
            if rank == 2:
                if killed:
                    die(f"step {step}: killing myself")
                dump_when_stuck(rank)
                linger(end, f"step {step}: stuck in a retry loop before its forward")
            else:
                dump_when_stuck(rank)
        if rank > 0:
            dist.recv(act, src=rank - 1)  # the activations of the stage before
        act = act * 0.5 + 1.0
        if rank < world - 1:
            dist.send(act, dst=rank + 1)
            dist.recv(act, src=rank + 1)  # the gradient back from the stage after
        if rank > 0:
            dist.send(act, dst=rank - 1)
        if step % 10 == 9:
            dist.all_reduce(torch.ones(4))  # a metric, every 10 steps
        time.sleep(0.05)


def tp_dp(rank: int, end: float) -> None:
    tp = [dist.new_group(r) for r in ([0, 1], [2, 3])][rank // 2]
    dp = [dist.new_group(r) for r in ([0, 2], [1, 3])][rank % 2]
    for step in range(STEPS):
        if step == AT:
            dump_when_stuck(rank)
        if rank == 1 and step == AT:
            print(f"rank {rank}: step {step}: skipping its tensor-parallel all_reduce", flush=True)
        else:
            dist.all_reduce(torch.ones(16), group=tp)  # the activations
        dist.all_gather_into_tensor(torch.zeros(16), torch.ones(8), group=tp)  # the expert outputs
        dist.all_reduce(torch.ones(32), group=dp)  # the gradients
        time.sleep(0.05)
        if time.monotonic() > end:
            return


def deadlock(rank: int, end: float) -> None:
    group_a = dist.new_group([0, 1])
    group_b = dist.new_group([0, 1])
    t = torch.ones(8)
    for step in range(STEPS):
        if step == AT:
            dump_when_stuck(rank)
            print(f"rank {rank}: step {step}: calling the groups in {'A, B' if rank == 0 else 'B, A'} order",
                  flush=True)
            first, second = (group_a, group_b) if rank == 0 else (group_b, group_a)
            dist.all_reduce(t, group=first)
            dist.all_reduce(t, group=second)
        else:
            dist.all_reduce(t, group=group_a)
            dist.all_reduce(t, group=group_b)
        time.sleep(0.05)
        if time.monotonic() > end:
            return


def main() -> None:
    end = deadline()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    scenario = os.environ.get("PROBE_SCENARIO", "hsdp_stall")
    print(f"rank {rank}: scenario {scenario}", flush=True)
    if scenario in ("hsdp_stall", "hsdp_killed"):
        hsdp(rank, end, killed=scenario == "hsdp_killed")
    elif scenario in ("pipeline_stuck", "pipeline_killed"):
        pipeline(rank, end, killed=scenario == "pipeline_killed")
    elif scenario == "deadlock":
        deadlock(rank, end)
    elif scenario == "tpdp_skip":
        tp_dp(rank, end)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main()
