"""The dashboard header: job identity, attach state and the worst current finding."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from rich.text import Text
from textual.widgets import Static

from ddptop.diagnosis.finding import Finding
from ddptop.model.job import JobModel
from ddptop.status import ENDED, Status
from ddptop.textfmt import human_duration, rank_ranges

_SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


def attach_state(statuses: dict[int, str], world_size: int,
                 counts: Counter[str] | None = None) -> tuple[str, str]:
    """('connected 4/4' | '1 stale (rank 2), 1 lost (rank 3)', level) from status words
    (*counts*: how many ranks have each word, where the caller keeps them)."""
    # Counted in C first: at 4096 ranks this runs at every redraw, and usually all is well.
    if counts is None:
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


class Identity(NamedTuple):
    """What the header's first line says of the job: earliest start, world, hosts, backend."""

    start: float
    world: int
    hosts: list[str]  # sorted
    backend: str  # the lowest rank's


def identity_by_loop(model: JobModel) -> Identity:
    """:class:`Identity` by one pass over every state (the reference :class:`HeaderFacts`
    is held to, and the way for a one-off header)."""
    states = [v.state for v in model.ranks.values() if v.state is not None]
    start = min([st.start_time for st in states if st.start_time], default=0.0)
    world = max([model.world_size, *[st.world_size for st in states]])
    backend = min(((st.rank, st.backend) for st in states if st.backend), default=(-1, ""))[1]
    return Identity(start, world, sorted({st.host for st in states}), backend)


class HeaderFacts:
    """:func:`identity_by_loop` kept up to date from the ranks the model marks dirty.

    At 32,768 ranks the loop costs milliseconds at every redraw, while the job's identity
    changes only when a rank starts, moves or ends. Each extreme is recomputed (one C-level
    pass) only when the rank holding it moved away from it.
    """

    def __init__(self, model: JobModel) -> None:
        self.model = model
        self._dirty = model.watch_dirty(detail_only=True)  # identity is detail: pulses pass by
        self._dirty.update(model.ranks)
        self._seen: set[int] = set()
        self._read: dict[int, object] = {}  # the state object each rank's identity was read from
        self._sign: dict[int, tuple[str, float, int, int, str] | None] = {}
        self._host: dict[int, str] = {}
        self._hosts: Counter[str] = Counter()
        self._sorted_hosts: list[str] = []
        self._start: dict[int, float] = {}
        self._world: dict[int, int] = {}
        self._backend: dict[int, tuple[int, str]] = {}
        self._extremes: tuple[float, int, tuple[int, str]] = (0.0, 0, (-1, ""))

    def identity(self) -> Identity:
        """The job's identity now (equal to :func:`identity_by_loop`)."""
        ranks = self.model.ranks
        if len(ranks) != len(self._seen):
            self._dirty.update(ranks.keys() - self._seen)  # a view made outside apply
        if self._dirty:
            self._fold()
        start, world, backend = self._extremes
        return Identity(start, max(self.model.world_size, world), self._sorted_hosts, backend[1])

    def _fold(self) -> None:
        hosts_before = len(self._hosts)
        moved_hosts = False
        start, world, backend = self._extremes
        redo = False
        views, signs, read = self.model.ranks, self._sign, self._read
        for rank in self._dirty:
            st = views[rank].base  # identity is detail: no merge of a waiting pulse
            # At scale most changes are a pulse over the same detail object: one identity
            # check. Otherwise a new sample of an unchanged identity: one tuple compare.
            if st is not None and read.get(rank) is st:
                continue
            read[rank] = st
            sign = None if st is None else (st.host, st.start_time, st.world_size, st.rank, st.backend)
            if rank in signs and signs[rank] == sign:
                continue
            signs[rank] = sign
            self._seen.add(rank)
            old_host = self._host.pop(rank, None)
            if old_host is not None:
                self._hosts[old_host] -= 1
                if not self._hosts[old_host]:
                    del self._hosts[old_host]
                    moved_hosts = True
            old = (self._start.pop(rank, None), self._world.pop(rank, None), self._backend.pop(rank, None))
            if st is None:
                redo = redo or old != (None, None, None)
                continue
            if st.host not in self._hosts:
                moved_hosts = True
            self._host[rank] = st.host
            self._hosts[st.host] += 1
            new = (st.start_time or None, st.world_size, (st.rank, st.backend) if st.backend else None)
            if new[0] is not None:
                self._start[rank] = new[0]
            self._world[rank] = new[1]
            if new[2] is not None:
                self._backend[rank] = new[2]
            # A rank that held an extreme and moved away from it: recompute that one pass.
            redo = redo or (old[0] == start and new[0] != start) or (old[1] == world and new[1] != world) \
                or (old[2] == backend and new[2] != backend)
            if not redo:
                if new[0] is not None and (not start or new[0] < start):
                    start = new[0]
                world = max(world, new[1])
                if new[2] is not None and (backend[0] < 0 or new[2] < backend):
                    backend = new[2]
        self._dirty.clear()
        if redo:
            start = min(self._start.values(), default=0.0)
            world = max(self._world.values(), default=0)
            backend = min(self._backend.values(), default=(-1, ""))
        self._extremes = (start, world, backend)
        if moved_hosts or len(self._hosts) != hosts_before:
            self._sorted_hosts = sorted(self._hosts)


def header_text(model: JobModel, now: float, worst: Finding | None, mode: str = "live",
                paused: bool = False, statuses: dict[int, str] | None = None,
                facts: HeaderFacts | None = None, counts: Counter[str] | None = None,
                dropped: int = 0) -> Text:
    """The two header lines as rich Text (pure, so snapshot tests can read it).

    *statuses* (rank -> status word at *now*) saves recomputing them when the caller has;
    *facts* (kept on this model) saves the pass over every state, *counts* (of *statuses*'
    words) the count of every rank's. *dropped*: events this viewer lost because it fell
    behind (its event buffer was full); said, since what is shown then lags the job.
    """
    start, world, hosts, backend = facts.identity() if facts is not None else identity_by_loop(model)
    uptime = now - start if start else None
    state, level = attach_state(model.statuses(now) if statuses is None else statuses,
                                model.world_size, counts if statuses is not None else None)
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
    if dropped:
        text.append(f" · ⚠ viewer behind: {dropped:,} event{'s' if dropped > 1 else ''} dropped",
                    style="bold yellow")
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
    _facts: HeaderFacts | None = None  # kept on the model shown (a replay seek brings a new one)
    dropped = 0  # events the viewer dropped, falling behind (the app's event buffer counts them)

    def show(self, model: JobModel, now: float, worst: Finding | None, mode: str = "live",
             paused: bool = False, statuses: dict[int, str] | None = None,
             counts: Counter[str] | None = None) -> None:
        """Redraw from the model at *now* (the text changes about once a second: its
        uptime; an unchanged text is not laid out and painted again)."""
        if self._facts is None or self._facts.model is not model:
            self._facts = HeaderFacts(model)
        text = header_text(model, now, worst, mode, paused, statuses, self._facts, counts, self.dropped)
        key = (text.plain, tuple(text.spans))
        if key != self._shown:
            self._shown = key
            self.update(text, layout=False)  # two lines, always (#header's height in the .tcss)
