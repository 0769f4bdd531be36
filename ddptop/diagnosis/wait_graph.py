"""Who waits for whom: one graph of the ranks' waits, the same live and after the job is gone.

Every rank is blocked in at most one op, read alike from its live state, its last words, a
recording or a Flight Recorder dump (they all arrive as ``RankState.collectives``):

* a **collective** (group, members as global ranks, the group's collective seq, op): it
  waits for the members of the group that have not entered that seq (the op table of
  :mod:`ddptop.diagnosis.op_semantics` decides only what counts as the *same* collective);
* a **point-to-point** op: a recv waits for its source, a blocking send for its destination;
* nothing: it is running, exited, dead, stopped or unreachable, which the rules tell.

The **sinks** are the ranks some rank waits for that wait for no one: the causes. Every
blocked rank with a path to a sink is its **victim**. Blocked ranks that reach no sink and
wait on each other in a cycle are a **deadlock**. A rank absent from the snapshot that is
waited for is a sink too (no dump, never heard from).

Members of a group come from ``CollectiveGroup.ranks`` where any rank sent them, the whole
job for the default group, else the ranks that report the group. "Entered" is FR's own
collective counter (``enqueued``) where sent, else ``seq`` (gloo's seq also counts p2p ops,
FR's does not). Edges of one (group, seq) are one shared set: 32,768 ranks waiting for one
rank cost one set, not 32,768. Pure: a snapshot and the clock in, a graph out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.memo import shared
from ddptop.model.pace import EVERY, give_way
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import CollectiveGroup, PendingOp, RankState
from ddptop.status import ENDED, Status

UNKNOWN_OP = "collective"  # op name when only a seq that stopped moving shows the wait


class Wait(NamedTuple):
    """What one rank is blocked in, and whom it waits for."""

    rank: int
    group: str
    op: PendingOp
    age: float  # seconds blocked at the graph's clock
    waits_for: frozenset[int]  # shared by every rank blocked in the same (group, seq)
    inferred: bool = False  # no op was recorded: its seq stood still at the group's newest collective


@dataclass
class GroupView:
    """One process group as the ranks together show it."""

    name: str
    desc: str = ""
    members: set[int] = field(default_factory=set)
    entered: dict[int, int] = field(default_factory=dict)  # rank -> the newest collective it entered
    gone: frozenset[int] = frozenset()  # members whose process ended

    def label(self) -> str:
        """'group 1 shard (ranks 2-3)'."""
        from ddptop.textfmt import rank_ranges

        desc = f" {self.desc}" if self.desc and self.desc not in ("undefined", "default_pg") else ""
        members = f" (ranks {rank_ranges(self.members)})" if self.members and self.name != "0" else ""
        return f"group {self.name}{desc}{members}"

    def top(self) -> int:
        return max(self.entered.values(), default=0)


@dataclass
class WaitGraph:
    """The ranks' waits, their ends (sinks) and their cycles."""

    waits: dict[int, Wait]
    groups: dict[str, GroupView]
    ends: dict[int, frozenset[int]]  # blocked rank -> the sinks its waits end at
    cycles: list[list[int]]  # blocked ranks that wait on each other and reach no sink

    def sinks(self) -> set[int]:
        """Every rank at the end of some wait."""
        return {r for e in self.ends.values() for r in e}

    def victims_of(self, sinks: Iterable[int]) -> set[int]:
        """The blocked ranks whose waits end at any of *sinks*."""
        wanted = set(sinks)
        return {r for r, e in self.ends.items() if e & wanted}

    def waiting_on(self, ranks: Iterable[int], most_hops: int = 64) -> set[int]:
        """The blocked ranks with a path to any of *ranks* (a mismatch's ranks, blocked too),
        found a hop at a time (a hang's chains are short; *most_hops* bounds a broken one)."""
        frontier, found = set(ranks), set()
        for _ in range(most_hops):
            new = {r for r, w in self.waits.items()
                   if r not in found and not w.waits_for.isdisjoint(frontier)}
            new -= frontier
            if not new:
                break
            found |= new
            frontier = new
        return found


def waits_final(snapshot: JobSnapshot) -> bool:
    """True when no rank that shows collectives is still running (dumps, the end of the job):
    its waits are what they will stay, no age to wait for."""
    return shared("waits_final", (snapshot,), (), lambda: not any(
        s.status in (Status.RUNNING, Status.STARTING) for s in snapshot.ranks if s.collectives))


def wait_graph(snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> WaitGraph:
    """The graph of *snapshot* at *now* (once per diagnosis: every rule that asks shares it)."""
    return shared("wait_graph", (snapshot,), (now, config), lambda: build(snapshot, now, config))


def build(snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> WaitGraph:
    """The graph, built (see the module)."""
    states = [s for s in snapshot.ranks if s.collectives]
    groups = _groups(states, snapshot.job.world_size)
    # The op each rank was blocked in when it was last seen, ended or not: a rank that ended
    # while blocked (NCCL's watchdog abort, the launcher's teardown, a dump written as it hung)
    # still tells whom it waited for. A rank that ended *outside* any op is waited for whatever
    # seq it reached: it can complete nothing now.
    blocking: dict[int, tuple[str, PendingOp]] = {}
    for i, s in enumerate(states):
        if not i % EVERY:
            give_way()
        newest = _newest_pending(s)
        if newest is not None:
            blocking[s.rank] = newest
    gone = frozenset(s.rank for s in snapshot.ranks if s.status in ENDED and s.rank not in blocking)
    for g in groups.values():
        g.gone = gone
    waits: dict[int, Wait] = {}
    shared_sets: dict[tuple[str, int], frozenset[int]] = {}
    for i, s in enumerate(states):
        if not i % EVERY:
            give_way()
        wait = _wait_of(s, blocking.get(s.rank), groups, now, config, shared_sets)
        if wait is not None:
            waits[s.rank] = wait
    ends, cycles = _ends(waits)
    return WaitGraph(waits=waits, groups=groups, ends=ends, cycles=cycles)


def entered(g: CollectiveGroup) -> int:
    """The newest collective a rank entered on *g*, by FR's collective count where known."""
    return g.enqueued if g.enqueued is not None else g.seq


def _groups(states: list[RankState], world: int) -> dict[str, GroupView]:
    out: dict[str, GroupView] = {}
    for s in states:
        for cg in s.collectives:
            g = out.get(cg.pg)
            if g is None:
                g = out[cg.pg] = GroupView(cg.pg)
            g.desc = g.desc or cg.desc
            if cg.ranks:
                g.members.update(cg.ranks)
            g.members.add(s.rank)
            # A rank blocked in a collective has entered it, whatever count its sample
            # carries (a seq read before the op was posted): it never waits for itself.
            g.entered[s.rank] = max([entered(cg), *(op.seq for op in cg.pending if not op.is_p2p)])
    if "0" in out and world:
        out["0"].members.update(range(world))
    return out


def _newest_pending(s: RankState) -> tuple[str, PendingOp] | None:
    newest: tuple[float, int, str, PendingOp] | None = None
    for cg in s.collectives:
        for op in cg.pending:
            if newest is None or (op.started_at, op.seq) > newest[:2]:
                newest = (op.started_at, op.seq, cg.pg, op)
    return None if newest is None else (newest[2], newest[3])


def _wait_of(s: RankState, pending: tuple[str, PendingOp] | None, groups: dict[str, GroupView], now: float,
             config: DiagnosisConfig, shared_sets: dict[tuple[str, int], frozenset[int]]) -> Wait | None:
    """The op *s* is blocked in: its newest pending op, else (no Flight Recorder on it) a group
    whose seq stood still at the group's newest collective while members are behind."""
    since_sample = max(0.0, now - s.time) if s.time else 0.0
    if pending is not None:
        pg, op = pending
        # The rank's own measure of the wait, aged by the sample's age: the rank's clock may be off ours
        age = op.age_s + since_sample if s.time else (now - op.started_at if op.started_at else op.age_s)
        if op.is_p2p:
            return Wait(s.rank, pg, op, age, frozenset(() if op.peer is None else (op.peer,)))
        g = groups[pg]
        behind = _behind(g, op.seq, shared_sets)
        if not behind and op.seq < g.top():
            # Every member entered it and some went further: nothing blocks it, its completion was
            # not recorded yet (gloo retires from its own threads). The rank is elsewhere.
            return None
        return Wait(s.rank, pg, op, age, behind)
    if s.status in ENDED or any(cg.last_completed is not None for cg in s.collectives):
        return None  # gone, or its recorder shows nothing pending: it is not in a collective
    for cg in s.collectives:
        g = groups[cg.pg]
        top = g.top()
        if top and entered(cg) == top and cg.seq_changed_at and now - cg.seq_changed_at >= config.stall_s:
            behind = _behind(g, top, shared_sets)
            if behind:
                return Wait(s.rank, cg.pg, PendingOp(seq=top, op=UNKNOWN_OP), now - cg.seq_changed_at,
                            behind, inferred=True)
    return None


def _behind(g: GroupView, seq: int, shared_sets: dict[tuple[str, int], frozenset[int]]) -> frozenset[int]:
    key = (g.name, seq)
    found = shared_sets.get(key)
    if found is None:
        entered_of, gone = g.entered, g.gone
        found = shared_sets[key] = frozenset(r for r in g.members if entered_of.get(r, -1) < seq or r in gone)
    return found


def _ends(waits: dict[int, Wait]) -> tuple[dict[int, frozenset[int]], list[list[int]]]:
    """Each blocked rank's sinks, and the cycles that reach none (Tarjan's strongly connected
    components, iteratively: a pipeline of 32,768 stages is one long chain)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    ends: dict[int, frozenset[int]] = {}
    cycles: list[list[int]] = []
    counter = 0
    for root in waits:
        if root in index:
            continue
        work: list[tuple[int, list[int]]] = [(root, sorted(waits[root].waits_for))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in waits:
                    continue  # a sink: handled when the component closes
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(waits[nxt].waits_for)))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] != index[node]:
                continue
            component: list[int] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            _close(component, waits, ends, cycles)
    return ends, cycles


def _close(component: list[int], waits: dict[int, Wait], ends: dict[int, frozenset[int]],
           cycles: list[list[int]]) -> None:
    """The sinks of one strongly connected component, from those of the components it waits on
    (already closed: Tarjan closes a component after everything it reaches)."""
    inside = set(component)
    reached: set[int] = set()
    single: frozenset[int] | None = None
    for r in component:
        for other in waits[r].waits_for:
            if other in inside:
                continue
            got = ends.get(other) if other in waits else frozenset((other,))
            if got is None:
                continue
            if single is None and not reached:
                single = got
            elif got is not single:
                if single is not None:
                    reached |= single
                    single = None
                reached |= got
    result = single if single is not None and not reached else frozenset(reached)
    for r in component:
        ends[r] = result
    if not result and (len(component) > 1 or component[0] in waits[component[0]].waits_for):
        cycles.append(sorted(component))
