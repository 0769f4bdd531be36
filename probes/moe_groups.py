"""Flight Recorder dumps of an MoE-like job: tensor-, data- and expert-parallel groups (test data).

Eight ranks on gloo, each group made with ``dist.new_group`` on every rank in the same
order and named by its ``group_desc``::

    tp (2 ranks): [0, 1] [2, 3] [4, 5] [6, 7]   made first, pg names 1..4
    ep (4 ranks): [0, 1, 2, 3] [4, 5, 6, 7]     then these, pg names 5, 6
    dp (4 ranks): [0, 2, 4, 6] [1, 3, 5, 7]     last, pg names 7, 8

(the default group, pg name 0, carries no collective). One training step, on each rank:

1. ``tp`` all_reduce of the activations (16 floats);
2. ``ep`` all_to_all_single of the token counts (one int64 per expert rank), so that each
   rank knows what it will receive: the output splits of step 3, as MoE dispatchers do;
3. ``ep`` all_to_all_single dispatch of the tokens (rows of 4 floats), with UNEVEN
   ``input_split_sizes`` (the counts routed to each expert rank: 0..5, seeded by step and
   rank, so they differ per rank and per step and are reproducible) and the matching
   ``output_split_sizes`` of step 2;
4. ``ep`` all_to_all_single combine: the tokens back, the splits swapped;
5. ``tp`` all_gather of the expert output (8 floats a rank);
6. ``dp`` all_reduce of the "grads" (32 floats).

So the all_to_all entries of one collective hold different input and output sizes on each
rank: that is a healthy all_to_all, not a mismatch.

Scenarios (PROBE_SCENARIO); step PROBE_STOP_STEP (default 3) of PROBE_STEPS (default 4):

* ``healthy``: every step runs everywhere; then every rank dumps while all are fine;
* ``stop_tp``: rank 5 stops (sleeps, holding nothing) just before its tp all_reduce (1.):
  rank 4 waits for it in tp [4, 5]; 6, 7 wait in ep [4..7] (counts, 2.); 0, 2 in dp
  [0, 2, 4, 6] and 1, 3 in dp [1, 3, 5, 7] (6.);
* ``stop_ep``: rank 2 stops just before the uneven ep dispatch (3.), after the count
  exchange: 0, 1, 3 wait for it in that all_to_all; 4, 6 wait in dp [0, 2, 4, 6] and
  5, 7 in dp [1, 3, 5, 7] (6.);
* ``stop_dp``: rank 6 stops just before the dp all_reduce (6.): 0, 2, 4 wait for it in dp
  [0, 2, 4, 6]; dp [1, 3, 5, 7] completes, then 1, 3, 5 and 7 wait in the next step's tp
  all_reduce for 0, 2, 4 and 6;
* ``killed_ep``: like ``stop_ep`` but rank 2 never dumps: it is SIGKILLed (by itself) once the
  other seven have dumped while waiting for it.

Dumps, as in ``probes/fr_dumps.py`` (NCCL's watchdog dumps every rank; gloo does not, so each
rank plays its part with torch's own serialisers, ``_dump_fr_trace`` for pickle,
``_dump_fr_trace_json`` for JSON): at the start of the stop step (after the last step for
``healthy``) every rank starts a thread that waits PROBE_DUMP_AFTER_S (default 3), writes
``<PROBE_DUMP_PREFIX><rank>`` (PROBE_DUMP_FORMAT: pickle or json), waits (bounded) until every
rank that is to dump has, and ends the process with ``os._exit(0)``; the stopped rank's dump
comes from that thread while its main thread sleeps. Waiting for the others' dumps keeps a
rank that exits from making a survivor's gloo fail before that survivor dumped. Process
groups time out after 300 s, long after the dumps. TORCH_FR_BUFFER_SIZE defaults to 400.

Run (the command that made tests/data/fr_moe/)::

    PROBE_SCENARIO=stop_ep PROBE_DUMP_PREFIX=/tmp/fr/comm_lib_trace_rank_ \\
    torchrun --standalone --nproc-per-node 8 --monitor-interval 10 probes/moe_groups.py
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
from fr_writer import ONCE, dump

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "400")

WORLD = 8
TP = [[0, 1], [2, 3], [4, 5], [6, 7]]
EP = [[0, 1, 2, 3], [4, 5, 6, 7]]
DP = [[0, 2, 4, 6], [1, 3, 5, 7]]
HIDDEN = 4
MAX_PER_EXPERT = 5  # tokens routed from one rank to one expert rank: 0..5
# scenario: (rank that stops, where: "tp" before 1., "ep" before 3., "dp" before 6.)
STOPS = {"stop_tp": (5, "tp"), "stop_ep": (2, "ep"), "stop_dp": (6, "dp"), "killed_ep": (2, "ep")}
KILLED = {"killed_ep": 2}



def wait_for_dumps(prefix: str, ranks: list[int], timeout_s: float = 60.0) -> None:
    """Until the dumps of *ranks* exist (bounded): no rank leaves while another has still to dump."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(os.path.exists(f"{prefix}{r}") for r in ranks):
        time.sleep(0.05)


def dump_later(prefix: str, rank: int, fmt: str, after_s: float, dumping: list[int]) -> None:
    """From now on this rank is where it will stay: dump after a while, then end."""
    def run() -> None:
        time.sleep(after_s)
        dump(prefix, rank, fmt)
        wait_for_dumps(prefix, dumping)
        os._exit(0)

    threading.Thread(target=run, daemon=True, name="fr-dump").start()


def die_undumped(prefix: str, rank: int) -> None:
    """The killed rank: gone before it could dump. It waits (bounded) until the others have
    dumped while waiting for it, then SIGKILLs itself (torchrun tears a job down as soon as a
    rank dies, and gloo's survivors would fail instead of hang: the order NCCL's survivors
    would produce, hang and dump while the dead rank never does, is kept this way)."""
    wait_for_dumps(prefix, [r for r in range(WORLD) if r != rank], timeout_s=120.0)
    os.kill(os.getpid(), signal.SIGKILL)


def make_groups() -> dict[str, dist.ProcessGroup]:
    """Every group on every rank, in the same order; this rank's group of each kind."""
    mine: dict[str, dist.ProcessGroup] = {}
    timeout = timedelta(seconds=300)
    for kind, layout in (("tp", TP), ("ep", EP), ("dp", DP)):
        for ranks in layout:
            group = dist.new_group(ranks, timeout=timeout, group_desc=kind)
            if dist.get_rank() in ranks:
                mine[kind] = group
    return mine


def routing(seed: int, step: int, rank: int, experts: int) -> list[int]:
    """Tokens this rank sends to each expert rank at *step*: uneven, reproducible."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    return [int(c) for c in torch.randint(0, MAX_PER_EXPERT + 1, (experts,), generator=gen)]


def step(n: int, rank: int, groups: dict[str, dist.ProcessGroup], seed: int,
         stop_at: str | None, stopped: object) -> None:
    """One training step; *stopped()* is called where this rank is to stop (*stop_at*)."""
    assert callable(stopped)
    tp, ep, dp = groups["tp"], groups["ep"], groups["dp"]
    act = torch.full((16,), float(rank + n))
    if stop_at == "tp":
        stopped()
    dist.all_reduce(act, group=tp)  # 1. tensor-parallel partial sums

    experts = dist.get_world_size(ep)
    send_counts = routing(seed, n, rank, experts)
    counts_in = torch.tensor(send_counts, dtype=torch.int64)
    counts_out = torch.empty(experts, dtype=torch.int64)
    dist.all_to_all_single(counts_out, counts_in, group=ep)  # 2. who sends me how many
    recv_counts = [int(c) for c in counts_out]

    tokens = torch.full((sum(send_counts), HIDDEN), float(rank))
    received = torch.empty((sum(recv_counts), HIDDEN))
    if stop_at == "ep":
        stopped()
    dist.all_to_all_single(received, tokens, output_split_sizes=recv_counts,  # 3. dispatch
                           input_split_sizes=send_counts, group=ep)
    back = torch.empty_like(tokens)
    dist.all_to_all_single(back, received * 2.0, output_split_sizes=send_counts,  # 4. combine
                           input_split_sizes=recv_counts, group=ep)

    out = torch.full((8,), float(back.sum()))
    gathered = [torch.empty_like(out) for _ in range(dist.get_world_size(tp))]
    dist.all_gather(gathered, out, group=tp)  # 5. sequence-parallel gather

    grads = torch.full((32,), float(rank))
    if stop_at == "dp":
        stopped()
    dist.all_reduce(grads, group=dp)  # 6. data-parallel gradient sync


def main() -> None:
    scenario = os.environ.get("PROBE_SCENARIO", "healthy")
    if scenario != "healthy" and scenario not in STOPS:
        raise SystemExit(f"unknown PROBE_SCENARIO {scenario!r}")
    prefix = os.environ.get("PROBE_DUMP_PREFIX") or os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    fmt = os.environ.get("PROBE_DUMP_FORMAT", "pickle")
    after = float(os.environ.get("PROBE_DUMP_AFTER_S", "3"))
    steps = int(os.environ.get("PROBE_STEPS", "4"))
    stop_step = int(os.environ.get("PROBE_STOP_STEP", "3"))
    seed = int(os.environ.get("PROBE_SEED", "0"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    assert dist.get_world_size() == WORLD, f"this probe wants {WORLD} ranks"
    groups = make_groups()
    culprit, where = STOPS.get(scenario, (-1, ""))
    killed = KILLED.get(scenario)
    dumping = [r for r in range(WORLD) if r != killed]

    def stopped() -> None:
        if killed == rank:
            die_undumped(prefix, rank)
        time.sleep(600)  # stopped, holding nothing; the dump thread ends the process

    try:
        for n in range(1, steps + 1):
            if scenario != "healthy" and n == stop_step and killed != rank:
                dump_later(prefix, rank, fmt, after, dumping)
            step(n, rank, groups, seed, where if rank == culprit and n == stop_step else None, stopped)
        if scenario == "healthy":
            dump_later(prefix, rank, fmt, after, dumping)
    except Exception as exc:  # gloo saw a peer go: dump, as NCCL does on an error
        if ONCE.locked():  # this rank has dumped: a peer that had too has left; the dump thread ends it
            time.sleep(600)
        print(f"rank {rank}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr, flush=True)
        dump(prefix, rank, fmt)
        os._exit(1)
    time.sleep(600)  # bounded: the dump thread ends the process long before


if __name__ == "__main__":
    main()
