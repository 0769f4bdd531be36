"""The dashboard header: job identity, attach state and the worst current finding."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ddptop.diagnosis.finding import Finding
from ddptop.model.job import JobModel
from ddptop.status import ENDED, Status
from ddptop.textfmt import human_duration, rank_ranges

_SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


def attach_state(statuses: dict[int, str], world_size: int) -> tuple[str, str]:
    """('connected 4/4' | '1 stale (rank 2), 1 lost (rank 3)', level) from status words."""
    bad: dict[str, list[int]] = {}
    for rank, status in statuses.items():
        if status == Status.STALE or (status in ENDED and status != Status.EXITED):
            bad.setdefault(status, []).append(rank)
    world = max(world_size, len(statuses))
    answering = sum(1 for s in statuses.values() if s != Status.STALE and s not in ENDED)
    if not bad:
        return f"connected {answering}/{world}", "ok" if answering == world else "warn"
    parts = [f"{len(r)} {k} (rank{'s' if len(r) > 1 else ''} {rank_ranges(r)})"
             for k, r in sorted(bad.items())]
    serious = {Status.LOST, Status.CRASHED, Status.TERMINATED} & set(bad)
    return "⚠ " + ", ".join(parts), "bad" if serious else "warn"


def header_text(model: JobModel, now: float, worst: Finding | None, mode: str = "live",
                paused: bool = False, statuses: dict[int, str] | None = None) -> Text:
    """The two header lines as rich Text (pure, so snapshot tests can read it).

    *statuses* (rank -> status word at *now*) saves recomputing them when the caller has.
    """
    # One pass over the states, not model.snapshot(): this runs at every redraw.
    states = [v.state for _, v in sorted(model.ranks.items()) if v.state is not None]
    starts = [st.start_time for st in states if st.start_time]
    uptime = now - min(starts) if starts else None
    world = max([model.world_size] + [st.world_size for st in states])
    hosts = sorted({st.host for st in states})
    backend = next((st.backend for st in states if st.backend), "")
    state, level = attach_state(model.statuses(now) if statuses is None else statuses,
                                model.world_size)
    text = Text()
    text.append(" ddptop ", style="bold reverse")
    text.append(f" job {model.job_id or '?'}", style="bold")
    text.append(f" · {world} ranks · hosts {_hosts(hosts)}")
    text.append(f" · {backend or '?'} · up {human_duration(uptime)} · ")
    text.append(state, style={"ok": "green", "warn": "yellow", "bad": "bold red"}[level])
    if mode == "replay":
        text.append(" · REPLAY", style="bold magenta")
    if paused:
        text.append(" · PAUSED", style="bold yellow")
    text.append("\n")
    if worst is None:
        text.append(" ✓ no findings", style="green")
    else:
        text.append(f" {worst.severity.upper()} ", style=_SEVERITY_STYLE.get(worst.severity, "") + " reverse")
        text.append(f" {worst.title}", style=_SEVERITY_STYLE.get(worst.severity, ""))
    return text


def _hosts(hosts: list[str], shown: int = 4) -> str:
    # 512 host names do not fit on a line: the first few and a count.
    if not hosts:
        return "?"
    more = f" +{len(hosts) - shown}" if len(hosts) > shown else ""
    return ", ".join(hosts[:shown]) + more


class JobHeader(Static):
    """Two lines at the top of the dashboard."""

    def show(self, model: JobModel, now: float, worst: Finding | None, mode: str = "live",
             paused: bool = False, statuses: dict[int, str] | None = None) -> None:
        """Redraw from the model at *now*."""
        self.update(header_text(model, now, worst, mode, paused, statuses))
