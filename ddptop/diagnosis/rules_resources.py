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
from ddptop.diagnosis.trend import Trend, trend
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.textfmt import human_bytes, human_duration


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
                rep = longest if group is members or longest in group else \
                    max(group, key=lambda s: len(histories.get(s.rank) or ()))
                found = _forecast(limit, rep, histories, config)
                if found is not None:
                    out.append(_finding(limit, (host, where), group, found, histories, config))
    return out


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
    place = {"cgroup memory": f"memory cgroup {where or '/'} on {host}", "host memory": f"{host}'s memory",
             "GPU memory": f"{where} on {host}", "/dev/shm": f"/dev/shm on {host}",
             "disk": f"the filesystem of {where or '?'} on {host}"}[limit.resource]
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
        evidence += _rss_risers(members, histories)
    forecast = Forecast(resource=limit.resource, where=where or host, used_bytes=int(t.used),
                        limit_bytes=int(t.limit), rate_bytes_per_s=t.rate, eta_s=t.eta_s, at=t.at,
                        reaches_at=t.reaches_at, shared_by=shared)
    return Finding(kind=limit.kind, severity=severity, ranks=shared, title=title, evidence=evidence,
                   remedy=limit.remedy, forecast=forecast)


def _rss_risers(members: list[RankState], histories: dict[int, list[Sample]]) -> list[str]:
    """Which of the ranks sharing a memory limit grow: their RSS floors, fastest first (3)."""
    rates: list[tuple[float, int]] = []
    for s in members:
        points = [(x.time, x.rss_bytes) for x in histories.get(s.rank) or [] if x.rss_bytes is not None]
        t = trend(points, float(1 << 62), window_s=float("inf"), min_span_s=0.0)
        if t is not None:
            rates.append((t.rate, s.rank))
    rates.sort(reverse=True)
    return [f"rank {rank}'s RSS rising {human_bytes(rate)}/s" for rate, rank in rates[:3]]
