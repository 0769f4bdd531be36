"""One rank dies in the middle of training; its peers are torn down by torchrun.

The ways of dying that a post-mortem must tell apart, chosen by PROBE_DEATH:

* ``exception``: rank PROBE_DIE_RANK (default 2) raises ``ValueError`` after
  PROBE_DIE_AT_STEP optimizer steps (default 12): exit code 1, a traceback, last words;
* ``sys_exit``: that rank calls ``sys.exit(PROBE_DIE_MESSAGE)`` there (default "rank R: bad
  shard 7"): exit status 1, the message on stderr, no traceback, between two collectives;
* ``wait_for_kill``: that rank stops training at that step and waits (bounded by
  PROBE_SECONDS) for someone outside to SIGKILL it, as the OOM killer or a scheduler
  would: no exception, no last words, only its exit status;
* ``worker_segfault``: one of that rank's DataLoader workers (worker 1) dies of SIGSEGV
  while it loads a batch; the rank then gets torch's "DataLoader worker (pid N) is killed
  by signal: Segmentation fault" and fails. The worker's crash, not the rank's, is the cause.

* ``sigkill``: that rank SIGKILLs itself right after that step, between two 1 Hz samples:
  only its progress page tells the step it died at;
* ``leak``: that rank allocates memory without end, as a leak would, until the OOM killer
  of the memory cgroup it runs in kills it (SIGKILL, no last words); with PROBE_LEAK_AFTER
  (a file name) it waits for that file to exist before it leaks.

Two more faults that a rank survives:

* ``wedge_gil``: at that step the rank calls C code that holds the GIL for PROBE_WEDGE_S
  seconds (libc ``sleep`` through ``ctypes.PyDLL``, which keeps the GIL, like a stuck
  extension or a spin in a custom op), then trains on; its reporter cannot run meanwhile;
* ``break_reporter``: from the start, psutil fails inside that rank (its
  ``virtual_memory`` raises), so the reporter's system sampling raises every time;
  training must not notice.

Each prints ``rank R: step N: ...`` when it plants the failure, so a test can compare the
step a post-mortem names with the real one. Peers block in the next all-reduce until
torchrun tears them down (SIGTERM). Run: ``torchrun --nproc-per-node 4 probes/rank_dies.py``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, setup, small_model, step_sleep, stop_together, train_step, wrap_ddp
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

DEATH = os.environ.get("PROBE_DEATH", "exception")
DIE_RANK = int(os.environ.get("PROBE_DIE_RANK", "2"))
DIE_AT = int(os.environ.get("PROBE_DIE_AT_STEP", "12"))


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples; in the ``worker_segfault`` death, worker 1 of the dying rank crashes."""

    def __init__(self, rank: int, n: int = 4096) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        self.crash_here = DEATH == "worker_segfault" and rank == DIE_RANK
        self.fetched = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        info = get_worker_info()
        self.fetched += 1  # per worker: each worker holds its own copy of the dataset
        if self.crash_here and info is not None and info.id == 1 and self.fetched > DIE_AT * 16 // 2:
            print(f"worker 1 of rank {DIE_RANK} (pid {os.getpid()}): reading address 0", flush=True)
            ctypes.string_at(0)
        return self.x[i], self.y[i]


def break_psutil() -> None:
    """Make psutil fail inside this process, as a broken install or a hostile sandbox would."""
    import psutil

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("planted: psutil is broken in this rank")

    psutil.virtual_memory = broken


def main() -> None:
    rank, world, device = setup(timeout_s=float(os.environ.get("PROBE_PG_TIMEOUT", "30")))
    if DEATH == "break_reporter" and rank == DIE_RANK:
        break_psutil()
        print(f"rank {rank}: step 0: psutil broken at t={time.time():.3f}", flush=True)
    torch.manual_seed(0)
    data = Samples(rank)
    sampler = DistributedSampler(data, seed=0)
    workers = 2 if DEATH == "worker_segfault" else 0
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=workers)
    model = wrap_ddp(small_model(), device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end, pause = deadline(), step_sleep()
    step, epoch, stop = 0, 0, False
    try:
        while not stop:
            sampler.set_epoch(epoch)
            for x, y in loader:
                train_step(model, opt, x, y, device)
                step += 1
                if rank == DIE_RANK and step == DIE_AT:
                    plant(rank, step, end)
                time.sleep(pause)
                stop = stop_together(end, device)
                if stop:
                    break
            epoch += 1
    except RuntimeError as exc:
        # torch raises a dead worker's error from its SIGCHLD handler, wherever the main
        # thread is: say at which step, then fail as the rank would have.
        if "DataLoader worker" in str(exc):
            print(f"rank {rank}: step {step}: the DataLoader failed: {exc}", flush=True)
        raise
    dist.destroy_process_group()


def wedge(rank: int, step: int) -> None:
    """Hold the GIL inside C code: until a byte arrives on PROBE_WEDGE_FIFO (a test releases
    it), else for PROBE_WEDGE_S seconds. ``ctypes.PyDLL`` calls keep the GIL held."""
    libc = ctypes.PyDLL(None)
    fifo = os.environ.get("PROBE_WEDGE_FIFO")
    print(f"rank {rank}: step {step}: wedged in C holding the GIL at t={time.time():.3f}", flush=True)
    if fifo:
        fd = os.open(fifo, os.O_RDWR)  # O_RDWR: the open itself never blocks on a FIFO
        libc.read(fd, ctypes.create_string_buffer(1), 1)
        os.close(fd)
        left = 0
    else:
        # libc sleep() returns the seconds left unslept: > 0 when a signal woke it early.
        left = libc.sleep(int(os.environ.get("PROBE_WEDGE_S", "8")))
    print(f"rank {rank}: step {step}: unwedged at t={time.time():.3f} (sleep left {left} s)", flush=True)


def plant(rank: int, step: int, end: float) -> None:
    """Die (or wait to be killed) as PROBE_DEATH says."""
    if DEATH == "exception":
        print(f"rank {rank}: step {step}: raising ValueError at t={time.time():.3f}", flush=True)
        raise ValueError(os.environ.get("PROBE_DIE_MESSAGE", "planted failure"))
    if DEATH == "sys_exit":
        message = os.environ.get("PROBE_DIE_MESSAGE", f"rank {rank}: bad shard 7")
        print(f"rank {rank}: step {step}: sys.exit({message!r}) at t={time.time():.3f}", flush=True)
        sys.exit(message)
    if DEATH == "wedge_gil":
        wedge(rank, step)
        return
    if DEATH == "leak":
        # Leak until the kernel's OOM killer ends it (run inside a memory cgroup), bounded;
        # with PROBE_LEAK_AFTER, once that file exists (a test readies itself first).
        hold = os.environ.get("PROBE_LEAK_AFTER", "")
        if hold:
            print(f"rank {rank}: step {step}: ready to leak (pid {os.getpid()})", flush=True)
            while not os.path.exists(hold) and time.monotonic() < end:
                time.sleep(0.05)
        print(f"rank {rank}: step {step}: leaking memory (pid {os.getpid()})", flush=True)
        hoard = []
        while time.monotonic() < end:
            hoard.append(bytearray(b"x" * (32 << 20)))  # written, so resident
            time.sleep(0.01)
        sys.exit(3)  # never killed: end on our own, visibly not an OOM kill
    if DEATH == "sigkill":
        print(f"rank {rank}: step {step}: SIGKILL now (pid {os.getpid()})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if DEATH == "wait_for_kill":
        print(f"rank {rank}: step {step}: waiting to be killed (pid {os.getpid()})", flush=True)
        while time.monotonic() < end:
            time.sleep(0.1)
        sys.exit(3)  # nobody came: end on our own, visibly not a kill


if __name__ == "__main__":
    main()
