"""The dashboard header: job identity, attach state and the worst current finding."""

from __future__ import annotations

from collections import Counter

from rich.text import Text
from textual.widgets import Static

from ddptop.diagnosis.finding import Finding
from ddptop.model.job import JobModel
from ddptop.status import ENDED, Status
from ddptop.textfmt import human_duration, rank_ranges

_SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


def attach_state(statuses: dict[int, str], world_size: int) -> tuple[str, str]:
    """('connected 4/4' | '1 stale (rank 2), 1 lost (rank 3)', level) from status words."""
    # Counted in C first: at 4096 ranks this runs at every redraw, and usually all is well.
    counts = Counter(statuses.values())
    bad_words = {w for w in counts if w == Status.STALE or (w in ENDED and w != Status.EXITED)}
    bad: dict[str, list[int]] = {}
    if bad_words:
        for rank, status in statuses.items():
            if status in bad_words:
                bad.setdefault(status, []).append(rank)
    world = max(world_size, len(statuses))
    answering = sum(n for w, n in counts.items() if w != Status.STALE and w not in ENDED)
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
    # Comprehensions over the states, not model.snapshot(): this runs at every redraw, and
    # at 4096 ranks an explicit loop with its branches cost twice as much.
    states = [v.state for v in model.ranks.values() if v.state is not None]
    start = min([st.start_time for st in states if st.start_time], default=0.0)
    world = max([model.world_size, *[st.world_size for st in states]])
    host_set = {st.host for st in states}
    # The lowest rank's backend, as before.
    backend = min(((st.rank, st.backend) for st in states if st.backend), default=(-1, ""))[1]
    uptime = now - start if start else None
    hosts = sorted(host_set)
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

    _shown: tuple[str, tuple[object, ...]] | None = None  # the text shown now

    def show(self, model: JobModel, now: float, worst: Finding | None, mode: str = "live",
             paused: bool = False, statuses: dict[int, str] | None = None) -> None:
        """Redraw from the model at *now* (the text changes about once a second: its
        uptime; an unchanged text is not laid out and painted again)."""
        text = header_text(model, now, worst, mode, paused, statuses)
        key = (text.plain, tuple(text.spans))
        if key != self._shown:
            self._shown = key
            self.update(text, layout=False)  # two lines, always (#header's height in the .tcss)
