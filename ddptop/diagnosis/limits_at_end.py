"""What was at its limit when a rank died: the end told by the resource, whatever the words (#55).

A save that finds its disk full does not always say so: torch's zip writer raises
``[enforce fail at inline_container.cc:672] . unexpected pos N vs M`` or ``basic_ios::clear:
iostream error``, never "No space left on device"; a native allocation that fails under a
memory cgroup raises ``std::bad_alloc`` or aborts. The rank's own last state tells what was
full: a rank that died within :data:`RECENT_S` of its last state, with a limit there at
:data:`FULL_SHARE` or more (the checkpoint disk: or with less room left than one of its saves
took), died of that limit. Pure: the final state in, :class:`AtLimit` (or None) out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddptop.diagnosis.steps import rises
from ddptop.protocol import RankState
from ddptop.status import Status
from ddptop.textfmt import human_bytes

RECENT_S = 60.0  # the last state this near the death tells what was full
FULL_SHARE = 0.97  # of a limit: at it (the kernel reclaims, a page or a block is left)


@dataclass(frozen=True, slots=True)
class AtLimit:
    """A limit the rank's last state found full."""

    cause: str  # as ddptop.diagnosis.foresight names it: "disk", "shm", "memory"
    words: str  # "the checkpoint disk was full: 300M of 300M at the last sample, 2 s before"
    share: float  # used of the limit


def at_limit(state: RankState, died_at: float) -> AtLimit | None:
    """The fullest limit *state* (a rank's last) was at, where it was taken within RECENT_S of
    *died_at* (0: unknown, the state's own time taken); None where none was full."""
    died_at = died_at or state.time
    if not state.time or died_at - state.time > RECENT_S:
        return None
    ago = max(0.0, died_at - state.time)
    when = f"at the last sample, {ago:.0f} s before" if ago >= 1 else "at the last sample"
    found: list[AtLimit] = []

    def full(cause: str, what: str, used: int | None, limit: int | None, room: float = 0.0) -> None:
        if used is None or not limit:
            return
        share = used / limit
        use = f"{human_bytes(used)} of {human_bytes(limit)} {when}"
        if share >= FULL_SHARE:
            found.append(AtLimit(cause, f"{what} was full: {use}", share))
        elif limit - used < room:
            found.append(AtLimit(cause, f"{what} had no room for another save: {use}, one save "
                                        f"takes {human_bytes(room)}", share))

    saves = rises(state.disk_levels)
    full("disk", f"the checkpoint disk ({state.disk_mount or state.disk_path})", state.disk_used_bytes,
         state.disk_total_bytes, room=saves[-1][1] if saves else 0.0)
    full("shm", "/dev/shm", state.shm_used_bytes, state.shm_total_bytes)
    full("memory", f"its memory cgroup {state.cgroup_path or '/'}", state.cgroup_memory_bytes,
         state.cgroup_memory_limit_bytes)
    if state.mem_total_bytes and state.mem_available_bytes is not None:
        full("memory", f"{state.host}'s memory" if state.host else "its host's memory",
             state.mem_total_bytes - state.mem_available_bytes, state.mem_total_bytes)
    return max(found, key=lambda a: a.share) if found else None


def full_at_own_end(s: RankState) -> AtLimit | None:
    """The limit *s*'s last state found full, for an end of its own (not a stop from outside,
    a scheduler's or the OOM killer's: those are told as they are)."""
    if s.exit_cause or s.exit_signal in ("SIGTERM", "SIGINT", "SIGHUP") or s.status in (
            Status.TERMINATED, Status.LOST, Status.TORN_DOWN):
        return None
    return at_limit(s, s.exited_at)


def memory_words(s: RankState) -> str:
    """The memory of a rank the OOM killer ended: its RSS, and the limit that bound it (the node
    agent's reading at the exit, else the rank's own of the cgroup it was last in), named."""
    rss = s.rss_bytes or s.memory_peak_bytes
    cap = s.memory_limit_bytes or s.cgroup_memory_limit_bytes
    where = f" of {s.cgroup_path}" if s.cgroup_path and s.cgroup_memory_limit_bytes else ""
    limit = f"the cgroup limit {human_bytes(cap)}{where}" if cap else "no cgroup limit"
    peak = f" (the cgroup peaked at {human_bytes(s.memory_peak_bytes)})" if s.memory_peak_bytes else ""
    return f"RSS {human_bytes(rss)} at its last sample, {limit}{peak}"
