"""Progress rules: unequal_batches, straggler, input_bound.

unequal_batches needs no history: the loader lengths are known before the first batch,
so it fires hours before the end-of-epoch desync it predicts (catalog F5). straggler and
input_bound judge a window of history, so that one slow sample never raises an alarm.
"""

from __future__ import annotations

import math
from collections import Counter

from ddptop.diagnosis.common import (
    active,
    fresh_ranks,
    human_duration,
    median,
    median_without,
    ranks_text,
)
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.lateness import entry_lateness
from ddptop.diagnosis.windows import Window, settled
from ddptop.model.pace import EVERY, give_way
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.status import Status


def unequal_batches(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                    config: DiagnosisConfig) -> list[Finding]:
    """Loader lengths differ across ranks: a desync at the end of an epoch or an evaluation.

    The training loader (``batches_per_epoch``: the loader whose batches drive optimizer
    steps) gives ``unequal_batches``; evaluation loaders that several ranks iterate give
    ``unequal_eval_batches`` (see :func:`_unequal_eval`).
    """
    return _unequal_train(snapshot) + _unequal_eval(snapshot)


def _unequal_train(snapshot: JobSnapshot) -> list[Finding]:
    states = [s for s in active(snapshot) if s.batches_per_epoch is not None]
    give_way()  # each pass over every rank is ~5-10 ms at 32,768 (model.pace)
    # A rank whose first optimizer step is still to come reports the loader it iterated
    # last (a sanity-check validation loader, say): compare it only once it knows its
    # training loader, unless no rank knows one yet.
    decided = [s for s in states if any(info.role == "train" for info in s.loaders)]
    give_way()
    counts = {s.rank: s.batches_per_epoch for s in (decided or states) if s.batches_per_epoch is not None}
    if len(counts) < 2 or len(set(counts.values())) < 2:
        return []
    (majority, votes), *rest = Counter(counts.values()).most_common()
    if rest and rest[0][1] == votes:
        odd = sorted(counts)  # no majority (e.g. every rank differs): every rank is involved
    else:
        odd = sorted(r for r, c in counts.items() if c != majority)
    shortest = min(counts.values())
    first_out = sorted(r for r, c in counts.items() if c == shortest)
    by_rank = snapshot.by_rank()
    evidence = ["batches per epoch: " + ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items()))]
    lead = by_rank[first_out[0]]
    left = shortest - lead.batch
    if lead.step_time_s and left >= 0:
        # None left is "now", never "about 0ms" (the screenshot of the F5 job said so).
        when = "out now" if left == 0 else f"about {human_duration(left * lead.step_time_s)}"
        evidence.append(f"{ranks_text(first_out)} runs out after {shortest} batches: {left} left in epoch "
                        f"{lead.epoch}, {when} at {lead.step_time_s:.3f} s/step")
    rng = _numpy_rng_note(list(by_rank.values()))
    if rng:
        evidence.append(rng)
    return [Finding(
        kind="unequal_batches", severity="critical", ranks=odd,
        title=(f"dataloader lengths differ across ranks ({min(counts.values())}..{max(counts.values())} "
               f"batches): the job will desync at the end of the epoch"),
        evidence=evidence,
        remedy=("give every rank the same data: seed the split (train_test_split(..., seed=1234)) and "
                "np.random.seed(...); numpy is not seeded by torch.manual_seed; use DistributedSampler "
                "(drop_last=True for uneven shards)"),
    )]


def _unequal_eval(snapshot: JobSnapshot) -> list[Finding]:
    """Evaluation loaders whose lengths differ across the ranks that iterate them.

    Loaders are matched across ranks by their order of first iteration and their class
    (the same code iterates the same loaders in the same order). Only loaders that fed
    no optimizer step while steps were counted (role ``eval``) are compared: the job
    hangs at the end of such a pass only if the evaluation loop runs collectives per
    batch (metric all-reduces, ``sync_dist``), hence a warning, not critical.
    """
    lengths: dict[tuple[int, str], dict[int, int]] = {}
    for i, s in enumerate(snapshot.ranks):  # a dead rank's loader lengths are still facts: post-mortem too
        if not i % EVERY:
            give_way()
        for info in s.loaders:
            if info.role == "eval" and info.length is not None:
                lengths.setdefault((info.index, info.name), {})[s.rank] = info.length
    out: list[Finding] = []
    for (index, name), counts in sorted(lengths.items()):
        if len(counts) < 2 or len(set(counts.values())) < 2:
            continue
        (majority, votes), *rest = Counter(counts.values()).most_common()
        tie = bool(rest) and rest[0][1] == votes
        odd = sorted(counts) if tie else sorted(r for r, c in counts.items() if c != majority)
        out.append(Finding(
            kind="unequal_eval_batches", severity="warning", ranks=odd,
            title=(f"evaluation loader #{index} {name} has {min(counts.values())}..{max(counts.values())} "
                   "batches across ranks: a collective per evaluation batch will desync"),
            evidence=["batches per pass: " + ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items()))],
            remedy=("shard evaluation data evenly: DistributedSampler(drop_last=False) pads every rank to "
                    "the same length; or keep per-batch collectives out of the evaluation loop"),
        ))
    return out


def _numpy_rng_note(states: list[RankState]) -> str:
    fps = {s.rank: s.rng_fingerprint.numpy for s in states if s.rng_fingerprint and s.rng_fingerprint.numpy}
    if len(set(fps.values())) > 1:
        distinct = len(set(fps.values()))
        return f"numpy RNG state differs across ranks ({distinct} distinct): numpy was not seeded alike"
    return ""


def straggler(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
              config: DiagnosisConfig) -> list[Finding]:
    """One rank persistently slower than its peers (step time, or share of time waiting for data).

    In synchronous DDP every rank's step interval is the same (the all-reduce waits for the
    slowest), so the slow rank also shows as the one that spends far more of each step in
    its DataLoader than its peers do; both signals are medians over ``window_s``.
    """
    fresh = fresh_ranks(snapshot, now, config)
    windows = settled(snapshot, histories, now, config)
    late = entry_lateness(snapshot, {s.rank for s in active(snapshot)
                                     if s.rank not in fresh and s.status == Status.RUNNING})
    if len(windows) < 2 and len(late) < 2:
        return []
    late_sorted = sorted(v.late_s for v in late.values())
    out: list[Finding] = []
    steps_sorted = sorted([w.step_time_s for w in windows.values() if w.step_time_s is not None])
    waits_sorted = sorted([w.data_wait for w in windows.values() if w.data_wait is not None])
    # Made for the first rank found only (a pass over every rank; most diagnoses find none).
    by_rank: dict[int, RankState] = {}
    progress: dict[int, int] = {}
    progress_sorted: list[float] = []
    for rank in sorted(_suspects(windows, steps_sorted, waits_sorted, config) | set(late)):
        window = windows.get(rank)
        step, wait = (window.step_time_s, window.data_wait) if window is not None else (None, None)
        o_step = median_without(steps_sorted, step) if step is not None else median(steps_sorted)
        o_wait = median_without(waits_sorted, wait) if wait is not None else median(waits_sorted)
        why: list[str] = []
        if step is not None and o_step and step > o_step * config.straggler_ratio \
                and step - o_step >= config.straggler_min_diff_s:
            why.append(f"median step time {step:.3f} s vs {o_step:.3f} s on the others "
                       f"({step / o_step:.1f}x) over the last {config.window_s:.0f} s")
        if wait is not None and o_wait is not None and wait - o_wait >= config.straggler_wait_gap:
            why.append(f"waits for data {wait:.0%} of each step vs {o_wait:.0%} on the others "
                       f"(median over the last {config.window_s:.0f} s)")
        entry = late.get(rank)
        if entry is not None:
            o_late = median_without(late_sorted, entry.late_s) or 0.0
            step_s = step if step is not None else median(steps_sorted)
            enough = max(config.straggler_min_diff_s, config.straggler_late_share * (step_s or 0.0))
            if entry.late_s - o_late >= enough and entry.late_s >= 2 * o_late:
                share = f" ({entry.late_s / step_s:.0%} of a {step_s:.3f} s step)" if step_s else ""
                why.append(f"enters collectives {entry.late_s * 1000:.0f} ms after the first rank "
                           f"(a quarter or more of {entry.collectives} collectives, seq {entry.first_seq}-"
                           f"{entry.last_seq}){share}; the others {o_late * 1000:.0f} ms")
        if not why:
            continue
        if not by_rank:
            by_rank = snapshot.by_rank()
            progress = {s.rank: s.step for s in active(snapshot)}
            progress_sorted = sorted(float(v) for v in progress.values())
        state = by_rank[rank]
        others_step = median_without(progress_sorted, float(progress[rank])) \
            if rank in progress else None
        if others_step is not None:
            why.append(f"step {state.step} vs median {others_step:.0f} on the others")
        out.append(Finding(
            kind="straggler", severity="warning", ranks=[rank],
            title=f"rank {rank} is the straggler: every other rank waits for it in each all-reduce",
            evidence=why, remedy=_straggler_remedy(state, wait),
        ))
    # Several "stragglers" at once are not one slow rank: keep the finding only when it is few.
    return out if len(out) <= max(1, max(len(windows), len(late)) // 4) else []


def _suspects(windows: dict[int, Window], steps_sorted: list[float], waits_sorted: list[float],
              config: DiagnosisConfig) -> set[int]:
    """The ranks whose window could make them a straggler: a superset, cheap to find.

    The median of the others is smallest when the rank left out is the slowest one, so a
    rank can only pass ``step > others * ratio`` and ``step - others >= min_diff`` if it
    passes them against that smallest median (float products and differences are monotone);
    likewise for the data-wait gap. At 32,768 ranks this skips the per-rank medians, bisects
    and text of the thousands of ranks that cannot qualify.
    """
    if not config.straggler_ratio > 0 or any(map(math.isnan, steps_sorted)) \
            or any(map(math.isnan, waits_sorted)):
        # The bound needs ordered values and a positive factor (NaN sorts nowhere, inf * 0 is
        # NaN): without them, judge every rank.
        return set(windows)
    low_step = median_without(steps_sorted, steps_sorted[-1]) if steps_sorted else None
    low_wait = median_without(waits_sorted, waits_sorted[-1]) if waits_sorted else None
    if low_step is None or len(steps_sorted) < 2:
        slow = {r for r, w in windows.items() if w.step_time_s is not None}
    else:
        slow = {r for r, w in windows.items() if w.step_time_s is not None
                and w.step_time_s > low_step * config.straggler_ratio
                and w.step_time_s - low_step >= config.straggler_min_diff_s}
    if low_wait is None or len(waits_sorted) < 2:
        waiting = {r for r, w in windows.items() if w.data_wait is not None}
    else:
        waiting = {r for r, w in windows.items() if w.data_wait is not None
                   and w.data_wait - low_wait >= config.straggler_wait_gap}
    return slow | waiting


def _straggler_remedy(state: RankState, window_wait: float | None) -> str:
    # The advice follows the evidence: the share of time waiting for data over the window
    # (one sample's share, the rank's latest, can be anything); the latest only without one.
    wait = window_wait if window_wait is not None else state.data_wait_fraction
    if wait is not None and wait > 0.3:
        return (f"rank {state.rank} is slow to load data on {state.host}: check that host's CPU load and "
                f"disk, keep num_workers x local ranks <= cores (num_workers now {state.loader_workers})")
    return (f"check rank {state.rank}'s host {state.host} (CPU/GPU load, thermal throttling, other jobs) "
            "and whether its batches are larger (sort or bucket by length alike on every rank)")


def input_bound(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                config: DiagnosisConfig) -> list[Finding]:
    """Ranks that spend most of each step waiting for a DataLoader whose queue is empty."""
    hits: dict[int, tuple[float, float | None]] = {}
    for rank, window in settled(snapshot, histories, now, config).items():
        wait = window.data_wait
        if wait is None or wait <= config.input_bound_wait:
            continue
        ready = window.ready_batches()  # only past the wait check: few ranks get here
        if ready is not None and ready > config.input_bound_ready:
            continue  # batches are waiting in the queue: the time goes elsewhere
        hits[rank] = (wait, ready)
    if not hits:
        return []
    by_rank = snapshot.by_rank()
    evidence = [f"rank {r}: waits for data {w:.0%} of each step, "
                f"{'?' if q is None else f'{q:.0f}'} batches prefetched, "
                f"num_workers {by_rank[r].loader_workers}" for r, (w, q) in sorted(hits.items())]
    workers = max(by_rank[r].loader_workers for r in hits)
    cores = min((by_rank[r].cpu_count or 0) for r in hits)
    local = Counter(s.host for s in active(snapshot))
    per_host = max(local[by_rank[r].host] for r in hits)
    if workers == 0:
        remedy = "load data in worker processes: DataLoader(num_workers=2, pin_memory=True) or more"
    elif cores and workers * per_host >= cores:
        remedy = (f"the CPUs are the limit (num_workers {workers} x {per_host} local ranks >= {cores} "
                  "cores): "
                  "make __getitem__ cheaper or pre-process the data; more workers will not help")
    else:
        more = min(workers * 2, max(workers + 1, cores // max(1, per_host) - 1))
        remedy = f"num_workers {workers} -> {more}, raise prefetch_factor, or make __getitem__ cheaper"
    return [Finding(
        kind="input_bound", severity="warning", ranks=sorted(hits),
        title=f"{ranks_text(hits)} input-bound: the DataLoader queue is empty and training waits for it",
        evidence=evidence, remedy=remedy,
    )]
