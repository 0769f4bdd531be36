"""Shared set-up for the demo and the probes: backend choice, a tiny model, a bounded run time.

Every probe picks nccl when CUDA is available and gloo otherwise, so the same script
runs unchanged on CPUs and GPUs, and every probe ends by itself within PROBE_SECONDS
(env, default 60) so no test can hang on it.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(timeout_s: float | None = None) -> tuple[int, int, torch.device]:
    """init_process_group with the right backend; returns rank, world size, device."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    kwargs = {}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    dist.init_process_group(backend, **kwargs)
    return dist.get_rank(), dist.get_world_size(), device


def deadline() -> float:
    """Monotonic time at which the probe must stop."""
    return time.monotonic() + float(os.environ.get("PROBE_SECONDS", "60"))


def small_model(width: int = 64, classes: int = 10) -> nn.Module:
    """A small MLP: enough parameters for DDP buckets, fast on one CPU core."""
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, classes))


def wrap_ddp(model: nn.Module, device: torch.device) -> DDP:
    """*model* on *device* in DDP (device_ids only on GPUs, as DDP requires)."""
    return DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               device: torch.device) -> torch.Tensor:
    """One DDP step; backward() is where DDP's bucketed all-reduces run."""
    loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def step_sleep() -> float:
    """Per-step pause (PROBE_STEP_SLEEP, s) so CPU jobs do not saturate small machines."""
    return float(os.environ.get("PROBE_STEP_SLEEP", "0.02"))


def stop_together(end: float, device: torch.device) -> bool:
    """True on every rank once any rank is past *end* (monotonic), decided by an all-reduce.

    Each rank checking only its own clock stops a step earlier or later than its peers
    (their deadlines differ by their start-up), and leaves them in a collective it never
    joins: a hang at the end of every probe. Call it once per step, on every rank.
    """
    flag = torch.tensor([1.0 if time.monotonic() > end else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    let_go(flag)
    return bool(flag.item() > 0)


def let_go(tensor: torch.Tensor, limit_s: float = 30.0) -> None:
    """Wait (bounded) until gloo's worker thread has let go of *tensor*, after its collective.

    gloo marks a collective done before its worker thread drops its own references to the
    collective's tensors: just after ``all_reduce`` returned, a tensor's use count was still 4
    in 1-57% of calls (2 ranks on 2 cores). When this Python object goes first, the worker's
    late drop needs the GIL; if the interpreter is finalizing by then, the thread exits inside
    a C++ destructor and the rank aborts at exit ("terminate called without an active
    exception", SIGABRT, after the job's last step: 2 of about 94 plain torchrun runs of the
    healthy probe, none of 260 with this wait). Holding the tensor until it is ours alone
    makes the worker's drop a plain decrement. Only gloo: the wait is for its worker thread.
    (Under ddptop the reporter's pause before ``destroy_process_group``, for a related exit
    deadlock, mostly hid this: see ``reporter/progress._patch_teardown``.)
    """
    use_count = getattr(tensor, "_use_count", None)  # torch's, private: a torch without it waits not
    if tensor.device.type != "cpu" or use_count is None:
        return
    give_up = time.monotonic() + limit_s
    while use_count() > 1 and time.monotonic() < give_up:
        time.sleep(0.0005)  # the condition is the worker's drop; it comes within microseconds


def hold_until_released(end: float) -> None:
    """After training: mark this rank as done and wait for the test to release it.

    The framework probes keep their final numbers on show: each rank writes
    ``$PROBE_RELEASE.held<rank>`` and waits (bounded by *end*, monotonic) until the file
    ``$PROBE_RELEASE`` appears. Without PROBE_RELEASE it returns at once. No collective
    runs while ranks wait, so a rank released first cannot hang its peers.
    """
    release = os.environ.get("PROBE_RELEASE", "")
    if not release:
        return
    rank = os.environ.get("RANK", "0")
    with open(f"{release}.held{rank}", "w") as marker:
        marker.write(f"{time.time()}\n")
    while not os.path.exists(release) and time.monotonic() < end:
        time.sleep(0.05)  # polling a file: the test's release is the condition
