"""After a death of memory, /dev/shm or disk: since when the trend had foreseen it.

The post-mortem (``rank_lost``) replays :mod:`ddptop.diagnosis.rules_resources`' forecast
over the dead rank's recorded history: at each sample, the window the live rule would have
judged (``window_s`` plus the margin), and whether it would have warned. The warning that
counts is the one that held to the end: walking back from the death, the first sample
of the last unbroken run of warnings ("foreseen 3m40s before, at 14:02:11"); the last
window before the death may hold none (use pinned at the limit while the kernel reclaims).
A checkpoint disk is replayed as the live rule judges it: by its saves
(:func:`ddptop.diagnosis.rules_resources.disk_steps`, the levels the rank kept up to each
sample) where they are recognised, else by its trend.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence

import msgspec

from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.limits_at_end import at_limit
from ddptop.diagnosis.rules_resources import disk_steps
from ddptop.diagnosis.trend import trend
from ddptop.protocol import RankState, Sample
from ddptop.rank_state import DISK_LEVELS_KEPT, kept_levels
from ddptop.textfmt import human_duration

HISTORY_MARGIN_S = 10.0  # as ddptop.diagnosis's: the window the live rules get


def _series(state: RankState, cause: str) -> tuple[str, Callable[[Sample], int | None], int | None] | None:
    """What ran out, the sample field of its use, and its limit, for a death of *cause*."""
    if cause == "memory":
        if state.cgroup_memory_limit_bytes:
            return "its memory cgroup", (lambda x: x.cgroup_memory_bytes), state.cgroup_memory_limit_bytes
        if state.mem_total_bytes:
            return "its host's memory", (lambda x: x.host_memory_used_bytes), state.mem_total_bytes
        return None
    if cause == "shm":
        return "/dev/shm", (lambda x: x.shm_used_bytes), state.shm_total_bytes
    if cause == "disk":
        disk = f"its checkpoint disk ({state.disk_mount or state.disk_path})"
        return disk, (lambda x: x.disk_used_bytes), state.disk_total_bytes
    return None


def foreseen(state: RankState, history: Sequence[Sample], died_at: float, cause: str,
             config: DiagnosisConfig | None = None) -> str:
    """'foreseen 3m40s before, at 14:02:11 (...)', or '' where the history holds no warning
    that lasted to the death (or nothing to judge by)."""
    config = config or DiagnosisConfig()
    found = _series(state, cause)
    if found is None or not found[2]:
        return ""
    what, used, limit = found
    settled = state.start_time + config.trend_warmup_s  # as the live rule: no start-up judged
    # The saves are judged from the rank's start (the trend after its warm-up).
    points = [(x.time, float(v)) for x in history
              if (state.start_time if cause == "disk" else settled) <= x.time <= died_at
              and (v := used(x)) is not None]
    if len(points) < 5:
        return ""
    levels = _levels(state, history) if cause == "disk" else []
    window = config.window_s + HISTORY_MARGIN_S
    times = [t for t, _ in points]
    first: tuple[float, float] | None = None  # (time, eta then)
    for end in range(len(points), 0, -1):  # from the death backwards, while it still warns
        now, used_now = points[end - 1]
        steps, warned = disk_steps([_at(state, levels, now, used_now)], now, config) if cause == "disk" \
            else (None, False)
        if steps is not None:  # saves recognised: the live rule judged by them alone
            if warned:
                first = (now, steps.eta_s)
                continue
            if first is None and now > died_at - window:
                continue
            break
        start = max(bisect.bisect_left(times, times[end - 1] - window), bisect.bisect_left(times, settled))
        t = trend(points[start:end], limit, window_s=window + 1.0, min_span_s=config.trend_min_span_s) \
            if start < end else None
        if t is None or t.eta_s >= config.exhaustion_warning_s:
            if first is None and times[end - 1] > died_at - window:
                continue  # the last moments: pinned at the limit, the kernel reclaiming, no slope
            break
        first = (t.at, t.eta_s)
    if first is None:
        return ""
    at, eta = first
    clock = time.strftime("%H:%M:%S", time.localtime(at))
    return (f"foreseen {human_duration(died_at - at)} before, at {clock}: {what} was then due to be full "
            f"in about {human_duration(eta)}")


def _levels(state: RankState, history: Sequence[Sample]) -> list[tuple[float, int]]:
    """The disk's levels over the whole *history*: those the rank kept, and where it kept its
    newest DISK_LEVELS_KEPT only, before them as kept from its samples' disk use (the same reads)."""
    kept = state.disk_levels
    if kept and len(kept) < DISK_LEVELS_KEPT:
        return kept  # all the rank kept: what the live rule judged, nothing before them
    since = kept[0][0] if kept else float("inf")
    older: list[tuple[float, int]] = []
    for x in history:
        if x.time >= since:
            break
        if x.disk_used_bytes is not None:
            older = kept_levels(older, x.time, x.disk_used_bytes)
    return [*older, *kept]


def _at(state: RankState, levels: list[tuple[float, int]], now: float, used: float) -> RankState:
    """*state* as it was at *now*: the disk *levels* kept by then, *used* its use."""
    return msgspec.structs.replace(state, disk_levels=levels[:bisect.bisect_right(levels, (now, 1 << 62))],
                                   disk_used_bytes=int(used))


def death_foreseen(state: RankState, history: Sequence[Sample], died_at: float, shm: bool) -> str:
    """:func:`foreseen` for a rank that died of a resource: the OOM killer's SIGKILL, a full
    /dev/shm (*shm*: the post-mortem read it so), a save that found its disk full, or any end
    within a minute of a limit its last state found full (:func:`at_limit`); else ''."""
    full = at_limit(state, died_at)
    if state.exit_cause == "oom_kill":
        cause = "memory"
    elif shm:
        cause = "shm"
    elif "No space left on device" in state.exit_reason or (state.disk_total_bytes and any(
            w in state.exit_reason for w in ("PytorchStreamWriter", "inline_container.cc"))):
        # torch.save's zip writer on a full disk: "[enforce fail at inline_container.cc:672] .
        # unexpected pos 704 vs 598", no errno (seen on a full tmpfs, torch 2.13)
        cause = "disk"
    elif full is not None:
        cause = full.cause
    else:
        return ""
    return foreseen(state, history, died_at, cause)
