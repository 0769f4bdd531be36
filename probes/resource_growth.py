"""Resources running out at a steady pace, or a healthy job that only looks like it (#48).

``PROBE_GROW`` picks the job (2 ranks, gloo, a small step every ~0.1 s):

* ``memory``: rank ``PROBE_DIE_RANK`` (1) keeps a list of buffers growing at a pace that
  fills its memory cgroup's headroom in ``PROBE_FILL_S`` seconds (read from the cgroup at
  the start), until the OOM killer ends it;
* ``shm_disk``: rank 0 saves a checkpoint of ``PROBE_CKPT_MB`` into ``PROBE_CKPT_DIR`` every
  ``PROBE_CKPT_EVERY`` s and keeps them all, until a save fails (it says so and goes on
  without saving); rank 1's DataLoader workers cache each sample in /dev/shm until the
  write fails, which ends the rank;
* ``healthy``: a warm-up that allocates ``PROBE_WARMUP_MB`` over its first 10 s then keeps
  it, a per-step sawtooth of ``PROBE_SAW_MB`` allocated and freed, and checkpoints that
  replace the last one, until ``PROBE_SECONDS`` or a release file;
* ``disk`` (#55): rank 0 saves a checkpoint of ``PROBE_CKPT_MB`` every ``PROBE_CKPT_EVERY`` s
  into ``PROBE_CKPT_DIR`` (known to ddptop only from ``torch.save``), keeps the last
  ``PROBE_CKPT_KEEP`` (0: all of them); the save that does not fit ends the rank.

``PROBE_LEAK_MBS`` sets the ``memory`` leak's pace outright (MB/s): for a rank moved into its
memory cgroup after it started, whose headroom at the start says nothing.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from common import deadline, setup
from torch.utils.data import DataLoader, Dataset

MB = 1 << 20


def _cgroup_headroom() -> int:
    """Bytes left under this process's memory cgroup limit (v1 or v2), else 512 MB."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            base, used, cap = "/sys/fs/cgroup", "memory.current", "memory.max"
        elif "memory" in controllers.split(","):
            base, used, cap = "/sys/fs/cgroup/memory", "memory.usage_in_bytes", "memory.limit_in_bytes"
        else:
            continue
        where = Path(base + rel)
        try:
            left = int((where / cap).read_text()) - int((where / used).read_text())
        except (OSError, ValueError):
            continue
        if left < 1 << 40:  # not "no limit"
            return left
    return 512 * MB


def _touch(size: int) -> bytearray:
    buf = bytearray(size)
    buf[::4096] = b"x" * len(buf[::4096])  # every page resident
    return buf


class ShmCache(Dataset[torch.Tensor]):
    """A dataset whose workers keep a copy of each sample in /dev/shm (a cache that never evicts)."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.05)
        Path(f"/dev/shm/probe-cache-{os.getpid()}-{i}").write_bytes(b"\0" * int(float(
            os.environ.get("PROBE_SHM_KB", "256")) * 1024))
        return torch.ones(4)


def main() -> None:
    rank, _world, device = setup()
    grow = os.environ.get("PROBE_GROW", "healthy")
    leaker = grow == "memory" and rank == int(os.environ.get("PROBE_DIE_RANK", "1"))
    fill_s = float(os.environ.get("PROBE_FILL_S", "90"))
    kept: list[bytearray] = []
    pace = max(MB, int(_cgroup_headroom() / fill_s)) if leaker else 0
    if leaker and os.environ.get("PROBE_LEAK_MBS"):
        pace = int(float(os.environ["PROBE_LEAK_MBS"]) * MB)
    if leaker:
        print(f"rank {rank}: leaking {pace / MB:.1f} MB/s (pid {os.getpid()})", flush=True)
    ckpt = Path(os.environ.get("PROBE_CKPT_DIR", f"/tmp/probe-ckpt-{uuid.uuid4().hex[:6]}"))
    saving = grow in ("shm_disk", "healthy", "disk") and rank == 0
    keep = int(os.environ.get("PROBE_CKPT_KEEP", "0"))
    if saving:
        ckpt.mkdir(parents=True, exist_ok=True)
    every = float(os.environ.get("PROBE_CKPT_EVERY", "1"))
    blob = torch.zeros(int(float(os.environ.get("PROBE_CKPT_MB", "1")) * MB) // 4)
    loader = iter(DataLoader(ShmCache(), batch_size=1, num_workers=2)) \
        if grow == "shm_disk" and rank == 1 else None
    start = last_save = last_leak = time.monotonic()
    warm_mb = float(os.environ.get("PROBE_WARMUP_MB", "0"))
    saw_mb = float(os.environ.get("PROBE_SAW_MB", "0"))
    t = torch.ones(1, device=device)
    step, end = 0, deadline()
    while time.monotonic() < end:
        step += 1
        now = time.monotonic()
        if loader is not None:
            next(loader)
        if leaker:
            kept.append(_touch(int(pace * (now - last_leak))))
            last_leak = now
        if grow == "healthy" and rank == 0:
            while len(kept) * 10 < warm_mb * min(1.0, (now - start) / 10):
                kept.append(_touch(10 * MB))
            saw = _touch(int(saw_mb * MB * (step % 5) / 4)) if saw_mb else None
            del saw
        if saving and now - last_save >= every:
            last_save = now
            try:
                torch.save(blob, ckpt / f"step{step:06d}.pt")
                print(f"rank {rank}: saved at t={time.time():.3f}", flush=True)
                if grow == "healthy" or keep:
                    for old in sorted(ckpt.glob("step*.pt"))[:-(keep or 1)]:
                        old.unlink()
            except Exception as exc:
                print(f"rank {rank}: checkpoint save failed at t={time.time():.3f}: {exc}", flush=True)
                if grow == "disk":
                    raise
                saving = False
        dist.all_reduce(t)
        time.sleep(0.1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
