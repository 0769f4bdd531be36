"""The wavefront across process groups: who the waiting ranks wait for (catalog F2, F5, dumps).

Input: every rank's groups as a Flight Recorder dump (or a rank's last words) left them,
with the group's members as global ranks (``CollectiveGroup.ranks``), the highest seq the
rank entered, its last ops and those still pending. Per group, the wavefront is the highest
collective any member entered: members that entered it and wait there are *victims*;
members that never entered it are where to look, unless they are themselves waiting in
another group, in which case the blame passes on to whoever that group waits for. The
end of every chain is named: a rank that left no dump, or one that entered no collective
since (it is computing, evaluating, stuck in Python). Ranks that entered the same seq with
a different op, size or dtype are a mismatch; the smaller side is the culprit.

Matching is by ``collective_seq_id`` per group (FR's ``record_id`` is a per-process
counter and means nothing across ranks). Pure: no clock is read, no file is opened.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.memo import shared
from ddptop.diagnosis.op_semantics import Signature, is_p2p, signature
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import PendingOp, RankState, Sample
from ddptop.textfmt import op_text, rank_ranges

MAX_EVIDENCE = 12
MAX_CHAIN = 64  # groups followed from one rank: a longer chain is a cycle or a broken dump
REMEDY_MISSING = ("look at where the named rank is instead (its stack, its log): a collective skipped "
                  "under a rank-dependent condition, a loop that ran fewer times on it (an unseeded split), "
                  "an exception caught and ignored, or a crash before it could dump")
REMEDY_MISMATCH = ("every rank must call the same collectives in the same order with the same shapes: "
                   "look for a collective under a condition that depends on the rank or on its data")


@dataclass
class _Group:
    """One process group as all the dumps together show it."""

    name: str
    desc: str = ""
    members: set[int] = field(default_factory=set)
    entered: dict[int, int] = field(default_factory=dict)  # rank -> highest seq it entered
    # seq -> rank -> the op it entered as that seq
    ops: dict[int, dict[int, PendingOp]] = field(default_factory=lambda: defaultdict(dict))

    def label(self) -> str:
        desc = f" {self.desc}" if self.desc and self.desc not in ("undefined", "default_pg") else ""
        members = f" (ranks {rank_ranges(self.members)})" if self.members else ""
        return f"group {self.name}{desc}{members}"


@dataclass(frozen=True)
class _Wait:
    """Where a rank is blocked: the newest op it entered and did not complete."""

    group: str
    op: PendingOp


def collective_wavefront(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                         config: DiagnosisConfig) -> list[Finding]:
    """Culprits of a hang across every group, from the ranks' dumped collectives."""
    if not applies(snapshot):
        return []
    states = {s.rank: s for s in snapshot.ranks if s.collectives}
    groups = _groups(states.values())
    waits = {r: w for r, s in states.items() if (w := _wait_of(s)) is not None}
    world = set(range(snapshot.job.world_size)) | set(states)
    out: list[Finding] = []
    for g in sorted(groups.values(), key=lambda g: (g.name != "0", g.name)):
        mismatch = _mismatch(g)
        if mismatch is not None:
            out.append(mismatch)
    if out:
        return out  # different calls at one seq: the cause, whatever waits on it
    explained: set[int] = set()
    for g in sorted(groups.values(), key=lambda g: (g.name != "0", g.name)):
        finding = _stall(g, groups, states, waits, world, explained)
        if finding is not None:
            out.append(finding)
    # The group the culprit itself is missing from, the oldest wait first: its finding reads
    # without the chain, and the collective it never entered first is where it stopped.
    return sorted(out, key=lambda f: (not f.title.startswith(ranks_text(f.ranks) + " never entered"),
                                      f.since or float("inf")))


def applies(snapshot: JobSnapshot) -> bool:
    """True when ranks carry dumped collectives with their groups' members (FR dumps).

    Asked by three rules of a diagnosis (a pass over every rank's groups): answered once."""
    return shared("wavefront_applies", (snapshot,), (),
                  lambda: any(g.ranks for s in snapshot.ranks for g in s.collectives))


def _groups(states: Iterable[RankState]) -> dict[str, _Group]:
    out: dict[str, _Group] = {}
    for s in states:
        for cg in s.collectives:
            g = out.setdefault(cg.pg, _Group(cg.pg))
            g.desc = g.desc or cg.desc
            g.members |= set(cg.ranks) | {s.rank}
            g.entered[s.rank] = cg.seq
            for op in cg.recent:
                if not is_p2p(op) and op.seq > 0:
                    g.ops[op.seq][s.rank] = op
    return out


def _wait_of(state: RankState) -> _Wait | None:
    pending = [(op.started_at, g.pg, op) for g in state.collectives for op in g.pending]
    if not pending:
        return None
    _, pg, op = max(pending, key=lambda item: (item[0], item[2].seq))
    return _Wait(pg, op)


def _mismatch(g: _Group) -> Finding | None:
    for seq in sorted(g.ops):
        ops = g.ops[seq]
        sides: dict[Signature, list[int]] = defaultdict(list)
        for rank, op in sorted(ops.items()):
            sides[signature(op)].append(rank)
        if len(sides) < 2:
            continue
        ordered = sorted(sides.values(), key=lambda ranks: (len(ranks), ranks))
        odd, rest = ordered[0], [r for side in ordered[1:] for r in side]
        tie = len(odd) == len(ordered[1])
        title = (f"{ranks_text(odd)} entered {op_text(ops[odd[0]])} as collective #{seq} of {g.label()}, "
                 f"while {ranks_text(rest)} entered {op_text(ops[rest[0]])}: it can never complete")
        if tie:
            title += " (as many ranks on each side: which one diverged cannot be told)"
        return Finding(kind="collective_mismatch", severity="critical",
                       ranks=sorted(odd + rest) if tie else odd, certain=not tie,
                       victims=[] if tie else rest, title=title,
                       evidence=[f"{ranks_text(side)}: {op_text(ops[side[0]])} #{seq}" for side in ordered],
                       remedy=REMEDY_MISMATCH)
    return None


def _stall(g: _Group, groups: dict[str, _Group], states: dict[int, RankState], waits: dict[int, _Wait],
           world: set[int], explained: set[int]) -> Finding | None:
    """The finding for one group whose members wait in a collective others never entered."""
    if not g.entered:
        return None
    top = max(g.entered.values())
    waiting = sorted(r for r, w in waits.items() if w.group == g.name and w.op.seq == top)
    if not waiting or set(waiting) <= explained:
        return None
    missing = sorted(r for r in g.members if g.entered.get(r, -1) < top)
    if g.name == "0":
        missing = sorted(set(missing) | (world - set(states)))
    if not missing:
        return None
    culprits: dict[int, str] = {}
    chain: list[str] = []
    for rank in missing:
        _blame(rank, groups, states, waits, world, culprits, chain, set())
    if not culprits:
        return None
    explained |= set(waiting)  # a missing rank waiting elsewhere still has its own group's story
    op = waits[waiting[0]].op
    # A rank whose dump shows it elsewhere is certain; one without a dump may have entered too.
    # Name the certain ones when there are any, and say what is unknown of the others.
    certain = sorted(r for r in culprits if r in states)
    names = certain or sorted(culprits)
    unknown = [r for r in sorted(culprits) if r not in names]
    if set(names) <= g.members:
        title = (f"{ranks_text(names)} never entered {op_text(op)} #{top} of {g.label()}, which "
                 f"{ranks_text(waiting)} wait in")
    else:  # the wait passes through other groups: name where it ends, not a group it is not in
        title = (f"{ranks_text(waiting)} wait in {op_text(op)} #{top} of {g.label()} for "
                 f"{ranks_text(missing)}, and their waits across groups end at {ranks_text(names)}: "
                 f"{culprits[names[0]]}")
    evidence = [f"rank {r}: {culprits[r]}" for r in names] + chain
    if unknown:
        evidence.append(f"{ranks_text(unknown)} left no dump: whether they entered #{top} is unknown")
    evidence.append(f"waiting in #{top}: {ranks_text(waiting)} (victims, not causes)")
    if len(evidence) > MAX_EVIDENCE:
        evidence = [*evidence[:MAX_EVIDENCE - 1], f"+{len(evidence) - MAX_EVIDENCE + 1} more"]
    victims = sorted((set(waiting) | set(missing) | {r for r in g.members if r in waits}) - set(culprits))
    return Finding(kind="collective_stall", severity="critical", ranks=names, victims=victims, title=title,
                   evidence=evidence, remedy=REMEDY_MISSING, since=op.started_at or None)


def _blame(rank: int, groups: dict[str, _Group], states: dict[int, RankState], waits: dict[int, _Wait],
           world: set[int], culprits: dict[int, str], chain: list[str], seen: set[int]) -> None:
    """Follow *rank*'s own wait to whoever is at the end of it; record culprits and the chain."""
    if rank in seen or len(seen) > MAX_CHAIN:
        return
    seen.add(rank)
    state = states.get(rank)
    if state is None:
        culprits[rank] = "left no dump (dead, killed, or its dump was not collected)"
        return
    wait = waits.get(rank)
    if wait is None:
        last = _last_entered(state)
        culprits[rank] = f"entered no collective since {last}: it is elsewhere (look at its stack and log)"
        return
    h = groups.get(wait.group)
    if wait.op.is_p2p and wait.op.peer is not None:
        chain.append(f"rank {rank} waits in {op_text(wait.op)} for rank {wait.op.peer}")
        _blame(wait.op.peer, groups, states, waits, world, culprits, chain, seen)
        return
    if h is None:
        return
    behind = sorted(r for r in h.members if h.entered.get(r, -1) < wait.op.seq and r != rank)
    if h.name == "0":
        behind = sorted(set(behind) | (world - set(states)))
    if not behind and len(h.members) > 1 and wait.op.seq < max(h.entered.values(), default=0):
        # Every member entered it and some went further: nothing blocks this op, its completion
        # was not recorded yet when the rank dumped (gloo retires from its own threads). The
        # rank is not waiting: it is elsewhere.
        culprits[rank] = (f"entered no collective since {_last_entered(state)}: it is elsewhere "
                          "(look at its stack and log)")
        return
    chain.append(f"rank {rank} waits in {op_text(wait.op)} #{wait.op.seq} of {h.label()}"
                 + (f" for {ranks_text(behind)}" if behind else
                    ": every member the dumps show entered it (on gloo a group's members show only once "
                    "they ran a collective in it)"))
    for other in behind:
        _blame(other, groups, states, waits, world, culprits, chain, seen)


def _last_entered(state: RankState) -> str:
    parts = [f"#{g.seq} of group {g.pg}" for g in state.collectives if g.seq]
    return ", ".join(parts[:3]) or "the start"
