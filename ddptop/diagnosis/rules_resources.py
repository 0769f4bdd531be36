"""Resources heading for their limit: memory_exhaustion, shm_exhaustion, disk_exhaustion.

Each limit is judged once, from the history of one rank that reads it (every rank of a
memory cgroup reads the same ``memory.current``; every rank of a host the same ``/dev/shm``),
with :func:`ddptop.diagnosis.trend.trend`: the floor of its newest samples, rising steadily,
and the time until the newest peak meets the limit at that rate. A warning under
``exhaustion_warning_s``, critical under ``exhaustion_critical_s``, with the rate, the
limit, the clock time it is reached and every rank that shares it.

The limits: a rank's memory cgroup (``memory.max`` / v1 ``memory.limit_in_bytes``, read by
the rank), the host's memory (total less available), the rank's GPU (NVML's used of total),
the host's ``/dev/shm`` and the filesystem of the rank's checkpoint directory.

A checkpoint disk filled by saves seconds or minutes apart is judged by its saves
(:mod:`ddptop.diagnosis.steps`, from the levels the rank kept of it) before any slope: where the
saves are recognised, their forecast alone speaks for that disk. Host memory names the job's
ranks only where their own RSS grows by at least half of the host's rise; else the finding
names none and says the growth is elsewhere (#55).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import cast

from ddptop.diagnosis.common import active, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding, Forecast, Severity
from ddptop.diagnosis.steps import StepGrowth, judged, ordinal
from ddptop.diagnosis.trend import Trend, trend
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.textfmt import human_bytes, human_duration

OWN_SHARE = 0.5  # host memory: the ranks' RSS rises at least this share of the host's to be named
NAMED_SHARE = 0.1  # ... else a rank is named where its own rise is this share of the host's or more


@dataclass(frozen=True, slots=True)
class Limit:
    """One kind of limit: what on a host shares it, what it is, and what a sample says of its use."""

    kind: str  # the finding's kind
    resource: str  # as a person names it
    # which of a host's ranks share one limit of this kind: None for the whole host's (no call
    # per rank: at 32,768 ranks every call per rank and limit costs ~30 ms)
    share: Callable[[RankState], str | None] | None
    limit: Callable[[RankState], int | None]
    used: Callable[[Sample], int | None]  # the use one history sample carries (an attrgetter)
    remedy: str


LIMITS: tuple[Limit, ...] = (
    Limit("memory_exhaustion", "cgroup memory",
          lambda s: s.cgroup_path if s.cgroup_memory_limit_bytes else None,
          lambda s: s.cgroup_memory_limit_bytes, attrgetter("cgroup_memory_bytes"),
          "find what keeps growing (a list of tensors kept across steps, a cache, a leaking loader: "
          "tracemalloc or memray on the fastest-rising rank) or raise the container's memory limit; "
          "at the limit the kernel's OOM killer ends the rank with SIGKILL and no traceback"),
    Limit("memory_exhaustion", "host memory", None, lambda s: s.mem_total_bytes,
          attrgetter("host_memory_used_bytes"),
          "find what keeps growing (tracemalloc or memray on the fastest-rising rank); at the end "
          "of the host's memory the OOM killer ends the largest process"),
    Limit("memory_exhaustion", "GPU memory", lambda s: None if s.gpu is None else f"gpu{s.gpu.index}",
          lambda s: s.gpu.mem_total_bytes if s.gpu is not None else None, attrgetter("gpu_mem_used_bytes"),
          "find what keeps growing on the GPU (tensors kept across steps: a loss not .item()'d, a "
          "growing cache; torch.cuda.memory_snapshot()); fragmentation: "
          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    Limit("shm_exhaustion", "/dev/shm", None, lambda s: s.shm_total_bytes, attrgetter("shm_used_bytes"),
          "enlarge /dev/shm (docker run --shm-size=8g) or lower num_workers / prefetch_factor; files "
          "left in /dev/shm by dead workers or other jobs count too (ls -la /dev/shm)"),
    Limit("disk_exhaustion", "disk", lambda s: s.disk_mount if s.disk_total_bytes else None,
          lambda s: s.disk_total_bytes, attrgetter("disk_used_bytes"),
          "free space where the checkpoints go (keep the last N checkpoints, delete the rest) or "
          "point them at a larger filesystem; the save that finds it full fails the job"),
)


def resource_exhaustion(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                        config: DiagnosisConfig) -> list[Finding]:
    """Every limit some running rank is heading for within ``exhaustion_warning_s``."""
    out: list[Finding] = []
    hosts: dict[str, list[RankState]] = defaultdict(list)
    for s in active(snapshot):
        hosts[s.host].append(s)
    for host, members in hosts.items():
        # One rank reads a limit for all who share it: the one with the longest history.
        longest = max(members, key=lambda s: len(histories.get(s.rank) or ()))
        for limit in LIMITS:
            groups: dict[str, list[RankState]] = {"": members}
            if limit.share is not None:
                groups = defaultdict(list)
                for s in members:
                    where = limit.share(s)
                    if where is not None:
                        groups[where].append(s)
            for where, group in groups.items():
                if limit.kind == "disk_exhaustion":
                    steps, warned = disk_steps(group, now, config)
                    if steps is not None:  # saves recognised: their forecast alone, steady between saves
                        if warned:
                            out.append(_step_finding((host, where), group, steps, config))
                        continue
                rep = longest if group is members or longest in group else \
                    max(group, key=lambda s: len(histories.get(s.rank) or ()))
                found = _forecast(limit, rep, histories, config)
                if found is not None:
                    out.append(_finding(limit, (host, where), group, found, histories, config))
    return out


def disk_steps(group: list[RankState], now: float, config: DiagnosisConfig) -> tuple[StepGrowth | None, bool]:
    """The saves filling the checkpoint disk *group* shares, from the rank that kept most of its
    levels (the one that saves), and whether they warn. No time-based warm-up: a job's first
    save counts as its others do; MIN_RISES alike saves are the warm-up (what a start-up writes
    once is not alike)."""
    rep = max(group, key=lambda s: len(s.disk_levels))
    return judged(rep.disk_levels, rep.disk_total_bytes, now, rep.start_time, config.exhaustion_warning_s)


def _forecast(limit: Limit, rep: RankState, histories: dict[int, list[Sample]],
              config: DiagnosisConfig) -> Trend | None:
    cap = limit.limit(rep)
    history = histories.get(rep.rank)
    if not cap or not history:
        return None
    values = list(map(limit.used, history))
    if values[-1] is None:
        return None
    # Its start-up and warm-up (imports, the model, the first batches: a rise that levels off)
    # are not judged.
    settled = rep.start_time + config.trend_warmup_s
    if history[0].time >= settled:  # the common case: a bound first, in C, on the whole window
        try:
            known = cast(list[int], values)  # a None raises TypeError below
            top, low = max(known), min(known)
        except TypeError:  # a sample without the value
            pass
        else:
            # The floor cannot rise faster than the window's whole range, nor start above its
            # top: a bound on the ETA from below that ends most limits here.
            span = history[-1].time - history[0].time
            if span <= 0 or (cap - top) * span > (top - low) * config.exhaustion_warning_s:
                return None
    points = [(x.time, v) for x, v in zip(history, values, strict=True)
              if v is not None and x.time >= settled]
    if len(points) < 2:
        return None
    found = trend(points, cap, window_s=points[-1][0] - points[0][0] + 1.0,
                  min_span_s=config.trend_min_span_s)
    return found if found is not None and found.eta_s < config.exhaustion_warning_s else None


def _finding(limit: Limit, key: tuple[str, str], members: list[RankState], t: Trend,
             histories: dict[int, list[Sample]], config: DiagnosisConfig) -> Finding:
    host, where = key
    severity: Severity = "critical" if t.eta_s < config.exhaustion_critical_s else "warning"
    shared = sorted(s.rank for s in members)
    named = shared
    place = _place(limit.resource, host, where)
    clock = time.strftime("%H:%M:%S", time.localtime(t.reaches_at))
    title = (f"{place} full in about {human_duration(t.eta_s)}, at {clock}: {human_bytes(t.used)} of "
             f"{human_bytes(t.limit)}, rising {human_bytes(t.rate)}/s ({ranks_text(shared)})")
    evidence = [
        f"{place}: {human_bytes(t.used)} used of {human_bytes(t.limit)} ({t.used / t.limit:.0%})",
        f"its floor (the per-step sawtooth left out) rose {human_bytes(t.rate)}/s over the last "
        f"{t.span_s:.0f} s: the limit in about {human_duration(t.eta_s)}, at {clock}",
        f"shared by {ranks_text(shared)}",
    ]
    if limit.kind == "memory_exhaustion" and limit.resource != "GPU memory":
        risers = _rss_rates(members, histories)
        evidence += [f"rank {rank}'s RSS rising {human_bytes(rate)}/s" for rate, rank in risers[:3]]
        own = sum(rate for rate, _ in risers)
        if limit.resource == "host memory" and own < OWN_SHARE * t.rate:
            # The host's memory is everyone's: the ranks are named for their own growth only,
            # each for a share of the host's rise (a few KB/s of a Python heap is no cause).
            named = sorted(rank for rate, rank in risers if rate >= NAMED_SHARE * t.rate)
            workers = " (their DataLoader workers' among them?)" if any(s.loader_workers for s in members) \
                else ""
            others = f"other processes{workers} grow {human_bytes(t.rate - own)}/s"
            whose = (f"the job's ranks are flat: {others}" if own < NAMED_SHARE * t.rate else
                     f"the job's ranks grow {human_bytes(own)}/s of it: {others}")
            title = (f"{place} full in about {human_duration(t.eta_s)}, at {clock}: {human_bytes(t.used)} of "
                     f"{human_bytes(t.limit)}, rising {human_bytes(t.rate)}/s; {whose}")
            evidence.append(whose)
    forecast = Forecast(resource=limit.resource, where=where or host, used_bytes=int(t.used),
                        limit_bytes=int(t.limit), rate_bytes_per_s=t.rate, eta_s=t.eta_s, at=t.at,
                        reaches_at=t.reaches_at, shared_by=shared)
    return Finding(kind=limit.kind, severity=severity, ranks=named, title=title, evidence=evidence,
                   remedy=limit.remedy, forecast=forecast)


def _place(resource: str, host: str, where: str) -> str:
    return {"cgroup memory": f"memory cgroup {where or '/'} on {host}", "host memory": f"{host}'s memory",
            "GPU memory": f"{where} on {host}", "/dev/shm": f"/dev/shm on {host}",
            "disk": f"the filesystem of {where or '?'} on {host}"}[resource]


def _step_finding(key: tuple[str, str], members: list[RankState], g: StepGrowth,
                  config: DiagnosisConfig) -> Finding:
    host, where = key
    severity: Severity = "critical" if g.eta_s < config.exhaustion_critical_s else "warning"
    shared = sorted(s.rank for s in members)
    place = _place("disk", host, where)
    clock = time.strftime("%H:%M:%S", time.localtime(g.due_at))
    nth = f"the {ordinal(g.fit + 1)} save from now" if g.fit else "the next save"
    title = (f"{place} full in about {human_duration(g.eta_s)}, at {clock}: {nth} of "
             f"{human_bytes(g.step)} (one every {human_duration(g.every_s)}) will not fit; "
             f"{human_bytes(g.used)} of {human_bytes(g.limit)} ({ranks_text(shared)})")
    evidence = [
        f"{place}: {human_bytes(g.used)} used of {human_bytes(g.limit)} ({g.used / g.limit:.0%})",
        f"its last {g.rises} saves: {human_bytes(g.step)} each, one every {human_duration(g.every_s)}, "
        f"{human_bytes(g.kept)} of each kept; {g.fit} more fit, {nth} is due at {clock}",
        f"shared by {ranks_text(shared)}",
    ]
    forecast = Forecast(resource="disk", where=where or host, used_bytes=int(g.used),
                        limit_bytes=int(g.limit), rate_bytes_per_s=g.rate, eta_s=g.eta_s, at=g.at,
                        reaches_at=g.due_at, shared_by=shared, step_bytes=int(g.step),
                        step_every_s=g.every_s, steps_fit=g.fit)
    return Finding(kind="disk_exhaustion", severity=severity, ranks=shared, title=title, evidence=evidence,
                   remedy=LIMITS[-1].remedy, forecast=forecast)


def _rss_rates(members: list[RankState], histories: dict[int, list[Sample]]) -> list[tuple[float, int]]:
    """(rate, rank) of each of *members* whose RSS floor rises, fastest first."""
    rates: list[tuple[float, int]] = []
    for s in members:
        points = [(x.time, x.rss_bytes) for x in histories.get(s.rank) or [] if x.rss_bytes is not None]
        t = trend(points, float(1 << 62), window_s=float("inf"), min_span_s=0.0)
        if t is not None:
            rates.append((t.rate, s.rank))
    rates.sort(reverse=True)
    return rates
