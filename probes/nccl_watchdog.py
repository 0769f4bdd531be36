"""NCCL's own watchdog firing on one GPU: real NCCL output for the post-mortem readers.

One rank (NCCL refuses two ranks on one GPU). A few all-reduces complete, then about
PROBE_BUSY_S seconds of matrix products are queued on the GPU stream and one more
all-reduce behind them. The process group's timeout is PROBE_PG_TIMEOUT_S (5 s): the
collective cannot finish before the products drain, so NCCL's watchdog catches it, prints
its "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=..." line, writes its
Flight Recorder dump (``TORCH_FR_DUMP_TEMP_FILE``/``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, set by
``ddptop launch``; ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, ``TORCH_FR_BUFFER_SIZE``) and aborts the
rank, as on a real hang. Nothing here imitates NCCL: every line and byte is its own.

Run: ``TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_BUFFER_SIZE=2000 ddptop launch -- torchrun
--standalone --nproc-per-node 1 probes/nccl_watchdog.py`` (bench/gpu_check.py does).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    """A few good all-reduces, then one stuck behind queued GPU work past the timeout."""
    timeout = timedelta(seconds=float(os.environ.get("PROBE_PG_TIMEOUT_S", "5")))
    busy_s = float(os.environ.get("PROBE_BUSY_S", "30"))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", timeout=timeout)
    x = torch.ones(4096, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    a = torch.randn(8192, 8192, device="cuda")
    start = time.monotonic()
    b = a @ a
    torch.cuda.synchronize()
    one = max(time.monotonic() - start, 1e-4)
    count = int(busy_s / one)
    for _ in range(count):  # one kernel each: the launch queue holds the rest of the work
        b = a @ a
    dist.all_reduce(x)  # behind the products: pending until they drain, past the timeout
    print(f"queued {count} products of {one * 1e3:.1f} ms, then all_reduce #6; timeout "
          f"{timeout.total_seconds():.0f} s", flush=True)
    torch.cuda.synchronize()  # the products drain; the watchdog has timed the all_reduce out by then
    print(f"all_reduce done ({float(b[0, 0]):.1f}); the watchdog aborts the rank once its dump is written",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
