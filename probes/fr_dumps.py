"""Flight Recorder dumps of a hung job, written by torch's own writers (catalog F2, F5 post-mortem).

What a person holds after a hang on NCCL: one dump per rank, written when the watchdog
fires. On gloo nothing dumps by itself, so each rank here plays NCCL's part with torch's
own serialisers (``_dump_fr_trace`` for pickle, ``_dump_fr_trace_json`` for JSON): once it
has reached the point where it blocks, a thread waits PROBE_DUMP_AFTER_S, writes
``<PROBE_DUMP_PREFIX><rank>`` and ends the process; a rank whose collective fails (gloo
notices a lost peer) dumps from its exception handler, as NCCL does on an error.

Scenarios (PROBE_SCENARIO), each with one culprit:

* ``skip``: rank 1 skips the 3rd of 5 all-reduces, so it ran 4; ranks 0, 2, 3 wait in #5 for it;
* ``op``: rank 2 calls all_gather where the others call all_reduce, at seq 3;
* ``killed``: rank 1 never enters the 3rd all-reduce and is killed (SIGKILL) without a dump;
* ``subgroup``: a group of ranks [0, 1] beside the default one; rank 1 never enters the
  group's all-reduce that rank 0 waits in, ranks 2 and 3 wait in the default group for both.

Run: ``PROBE_SCENARIO=skip PROBE_DUMP_PREFIX=/tmp/fr/rank_ torchrun --nproc-per-node 4
--monitor-interval 10 probes/fr_dumps.py`` (a slow monitor lets the survivors of ``killed``
dump before torchrun tears them down, as NCCL's ranks would while they hang).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from fr_writer import dump

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")




def dump_later(prefix: str, rank: int, fmt: str, after_s: float) -> None:
    """From now on this rank is where it will stay: dump after a while, then end."""
    def run() -> None:
        time.sleep(after_s)
        dump(prefix, rank, fmt)
        os._exit(0)

    threading.Thread(target=run, daemon=True, name="fr-dump").start()


def main() -> None:
    scenario = os.environ.get("PROBE_SCENARIO", "skip")
    # Where NCCL would put its dump (ddptop launch points it into the job's record).
    prefix = os.environ.get("PROBE_DUMP_PREFIX") or os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    fmt = os.environ.get("PROBE_DUMP_FORMAT", "pickle")
    after = float(os.environ.get("PROBE_DUMP_AFTER_S", "3"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    sub = dist.new_group([0, 1]) if scenario == "subgroup" else None
    t = torch.ones(64)
    try:
        run(scenario, rank, t, sub, lambda: dump_later(prefix, rank, fmt, after), prefix)
    except Exception as exc:  # gloo saw a peer go: dump, as NCCL does on an error
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr, flush=True)
        dump(prefix, rank, fmt)
        os._exit(1)
    time.sleep(600)  # bounded: the dump thread ends the process long before


def die_undumped(prefix: str, world: int) -> None:
    """Rank 1 of ``killed``: gone before it could dump. It waits (bounded) until the others have
    dumped while waiting for it in #3, then is SIGKILLed: torchrun tears a job down as soon as it
    sees a rank die, and gloo's survivors would fail instead of hang, so the order NCCL's
    survivors would produce (they hang and dump, the dead rank never does) is kept this way."""
    others = [f"{prefix}{r}" for r in range(world) if r != 1]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in others):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)


def run(scenario: str, rank: int, t: torch.Tensor, sub: dist.ProcessGroup | None, blocking: object,
        prefix: str = "") -> None:
    """The scenario's collectives; *blocking()* is called right before the point where the rank stays."""
    assert callable(blocking)
    if scenario == "skip":
        for i in range(1, 6):
            if rank == 1 and i == 3:
                continue  # a collective under a rank-dependent condition
            if i == 5:
                blocking()
            dist.all_reduce(t)  # rank 1's 3rd call pairs with the others' 3rd: same shape, silent
        if rank == 1:
            blocking()
            time.sleep(600)  # it thinks it is done ("evaluates") while the others wait in #5
    elif scenario == "op":
        for i in range(1, 4):
            if i == 3:
                blocking()
                if rank == 2:
                    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
                    dist.all_gather(out, t)
                    continue
            dist.all_reduce(t)
    elif scenario == "killed":
        for i in range(1, 4):
            if i == 3:
                if rank == 1:
                    die_undumped(prefix, dist.get_world_size())
                blocking()
            dist.all_reduce(t)
    elif scenario == "subgroup":
        dist.all_reduce(t)
        dist.all_reduce(t)
        blocking()
        if rank == 0:
            dist.all_reduce(t, group=sub)  # rank 1 never comes
        elif rank == 1:
            time.sleep(600)
        dist.all_reduce(t)
    else:
        raise SystemExit(f"unknown PROBE_SCENARIO {scenario!r}")


if __name__ == "__main__":
    main()
