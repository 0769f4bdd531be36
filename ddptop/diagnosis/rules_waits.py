"""collective_stall and collective_deadlock, read from the one wait-for graph (catalog F2, F3, F5).

Live states, last words, recordings and Flight Recorder dumps all give the same graph
(:mod:`ddptop.diagnosis.wait_graph`), and the same words come out of it: the culprits are
its sinks, each told with its own state (never entered the collective, not heard from,
gone with its status, left no dump); the victims are the blocked ranks whose waits end
there, listed with the edge each waits on. A cycle of waits that reaches no sink is a
deadlock, its own finding. Every rank inside the same collective with nobody missing is the
network or a slow save, judged by age (:func:`all_stuck`).

Live, a wait counts once the ranks held up directly have waited ``stall_s`` (a collective
a peer enters a second late is normal); a dump set is the end of the job: its waits are final.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

from ddptop.diagnosis.common import active, fresh_ranks, human_duration, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding, WaitEdge
from ddptop.diagnosis.rules_unresponsive import is_stopped
from ddptop.diagnosis.wait_graph import Wait, WaitGraph, wait_graph, waits_final
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.status import Status
from ddptop.textfmt import op_text

MAX_EDGE_LINES = 8  # classes of victims told one line each ("ranks 0-5 wait for rank 7 in ...")
MAX_SINK_LINES = 8
DID_NOT_REPORT = "did not report"
REMEDY = ("look at what the named rank is doing (stacks: press s in `ddptop attach`): a rank that loads "
          "data slowly, ran out of batches, took another code path or died; if it is saving a checkpoint, "
          "that is expected for the duration of the save")
REMEDY_DEADLOCK = ("these ranks call collectives of different groups in opposite orders: every rank must "
                   "enter the groups' collectives in one order (look at the two places in the code)")
_GONE = frozenset((Status.LOST, Status.CRASHED, Status.EXITED, Status.TERMINATED, Status.TORN_DOWN))


def collective_stall(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                     config: DiagnosisConfig) -> list[Finding]:
    """Ranks held up by the sinks of their waits, one finding per set of sinks."""
    if len(snapshot.ranks) < 2 and snapshot.job.world_size < 2:
        return []  # a one-rank job has no peer to wait for
    graph = wait_graph(snapshot, now, config)
    if not graph.waits:
        return []
    final = waits_final(snapshot)
    fresh = fresh_ranks(snapshot, now, config)
    out: list[Finding] = []
    for sinks in _events(graph, fresh):
        finding = _held_up(snapshot, graph, sinks, now, config, final)
        if finding is not None:
            out.append(finding)
    out += [f for cycle in graph.cycles if (f := _deadlock(graph, cycle, now, config, final)) is not None]
    stuck = all_stuck(snapshot, graph, now, config)
    if stuck is not None:
        out.append(stuck)
    return out


def _events(graph: WaitGraph, fresh: set[int]) -> list[frozenset[int]]:
    """The sinks, in sets that hold up the same ranks (two ranks killed together: one event)."""
    parent: dict[int, int] = {}

    def root(r: int) -> int:
        while parent.setdefault(r, r) != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for rank, ends in graph.ends.items():
        if rank in fresh or not ends:
            continue  # a rank that just restarted counts its collectives from 0 again
        first = next(iter(ends))
        for other in ends:
            parent[root(other)] = root(first)
    by_root: dict[int, set[int]] = defaultdict(set)
    for r in parent:
        by_root[root(r)].add(r)
    return sorted((frozenset(s) for s in by_root.values()), key=min)


def _held_up(snapshot: JobSnapshot, graph: WaitGraph, sinks: frozenset[int], now: float,
             config: DiagnosisConfig, final: bool) -> Finding | None:
    victims = graph.victims_of(sinks)
    # Blocked ranks on the way that wait for no one they can name (a gloo group whose other
    # members the dumps cannot show) are on the path too: victims, told with their edge.
    todo = [r for v in victims for r in graph.waits[v].waits_for if r in graph.waits and r not in victims]
    while todo:
        r = todo.pop()
        if r not in victims:
            victims.add(r)
            todo += [o for o in graph.waits[r].waits_for if o in graph.waits and o not in victims]
    direct = sorted(r for r in victims if graph.waits[r].waits_for & sinks)
    age = min(graph.waits[r].age for r in direct)
    if not final and age < config.stall_s:
        return None
    by_rank = snapshot.by_rank()
    began = now - age
    # The wait each sink holds up directly (the first by rank): what its state is told against
    held = {r: next(graph.waits[d] for d in direct if r in graph.waits[d].waits_for) for r in sinks}
    states = {r: _sink_state(r, by_rank.get(r), snapshot, graph, held[r], now, began, final) for r in sinks}
    # A rank of which nothing is known (no dump, never heard from) may have entered too: name
    # the ranks whose own state shows them elsewhere where there are any (a dump set often
    # lacks a dump that was never collected).
    known = sorted(r for r in sinks if r in by_rank and by_rank[r].status != Status.UNREACHABLE)
    names = known if final and known else sorted(sinks)
    unknown = sorted(set(sinks) - set(names))
    first = graph.waits[direct[0]]
    where = _where(first, graph)
    waiting = sorted(r for r in victims if r not in names)
    here = (first.group, first.op.seq)
    one_hop = all((graph.waits[r].group, graph.waits[r].op.seq) == here for r in victims)
    if not one_hop or first.op.is_p2p:  # "it" is no one collective: each sink with what its own peers need
        states = {r: w.replace("never entered it", _not_in(held[r], graph), 1) for r, w in states.items()}
    told = _told(names, states)
    if one_hop:
        title = f"{_have(direct)} waited {human_duration(age)} in {where}; " + "; ".join(told)
    else:
        across = " across groups" if len({graph.waits[r].group for r in victims}) > 1 else ""
        title = (f"{_have(waiting)} waited {human_duration(age)}: their waits{across} end at "
                 f"{ranks_text(names)}: " + "; ".join(told))
    evidence = [f"rank {r} {states[r]}" for r in names[:MAX_SINK_LINES]]
    if len(names) > MAX_SINK_LINES:
        evidence.append(f"+{len(names) - MAX_SINK_LINES} more ranks held them up")
    if unknown:
        they = "it" if len(unknown) == 1 else "they"
        evidence.append(f"{ranks_text(unknown)} left no dump: whether {they} entered {where} is unknown")
    evidence += _edge_lines(graph, victims)
    op = first.op
    if op.timeout_s and not final:
        evidence.append(f"the watchdog fires after {human_duration(op.timeout_s)}, "
                        f"{human_duration(max(0.0, op.timeout_s - age))} from now")
    gone = any(r not in by_rank or by_rank[r].status in _GONE or r in snapshot.job.unreachable for r in sinks)
    watchdog_half = bool(op.timeout_s and age >= op.timeout_s / 2)
    critical = final or gone or age >= config.stall_critical_s or watchdog_half
    return Finding(kind="collective_stall", severity="critical" if critical else "warning", ranks=names,
                   victims=waiting, title=title, evidence=evidence, remedy=REMEDY, since=began,
                   waits=_edges(graph, victims))


def _where(wait: Wait, graph: WaitGraph, sizes: bool = False) -> str:
    """'gloo:all_reduce #37', 'all_reduce [64] float32 #37 of group 2 tp (ranks 4-5)',
    'gloo:recv from rank 1'."""
    op = wait.op
    text = op_text(op) if sizes and op.sizes and op.sizes[0] else op.op
    if op.is_p2p:
        if op.peer is None or "->" in op.op or "<-" in op.op:
            return text
        return f"{text} {'from' if 'recv' in op.op else 'to'} rank {op.peer}"
    return f"{text} #{op.seq}" + ("" if wait.group == "0" else f" of {graph.groups[wait.group].label()}")


def _not_in(wait: Wait, graph: WaitGraph) -> str:
    """What a sink did not do that *wait* needs: enter the collective, or post the matching p2p op."""
    if wait.op.is_p2p:
        other = "send" if "recv" in wait.op.op else "recv"
        return f"never posted the {other} that rank {wait.rank} waits for"
    return f"never entered {_where(wait, graph)}"


def _have(ranks: list[int]) -> str:
    return f"{ranks_text(ranks)} {'has' if len(set(ranks)) == 1 else 'have'}"


def _told(names: list[int], states: dict[int, str]) -> list[str]:
    """'rank 3 never entered it', 'ranks 4-5 never heard from': the sinks grouped by their state."""
    by_words: dict[str, list[int]] = defaultdict(list)
    for r in names:
        words = states[r].split(" (", 1)[0]
        by_words[words].append(r)
    order = ("never entered", "not heard from since it began", "never heard from")

    def rank_of(words: str) -> int:
        return next((i for i, o in enumerate(order) if words.startswith(o)), len(order))

    ordered = sorted(by_words.items(), key=lambda kv: (rank_of(kv[0]), kv[1][0]))
    return [f"{ranks_text(rs)} {words}" for words, rs in ordered]


def _sink_state(rank: int, s: RankState | None, snapshot: JobSnapshot, graph: WaitGraph, held: Wait,
                now: float, began: float, final: bool) -> str:
    """What the sink *rank* is doing instead of the op its peers wait in."""
    if s is None or s.status == Status.UNREACHABLE:
        if final:
            return "left no dump (dead, killed, or its dump was not collected)"
        why = snapshot.job.unreachable.get(rank, "")
        return "never heard from" + (f" ({why})" if why else "")
    seq = graph.groups[held.group].entered.get(rank)
    if s.status in _GONE:
        # "cleanly" only for a status read as 0: an exit whose status nobody read is just "exited"
        how = "exited cleanly" if s.status == Status.EXITED and s.exit_code == 0 else str(s.status)
        if s.exit_signal:
            how = f"{s.status} (signal {s.exit_signal})"
        elif s.exit_code not in (None, 0):
            how = f"{s.status} (exit status {s.exit_code})"
        reason = s.exit_reason.strip().splitlines()[-1][:200] if s.exit_reason.strip() else ""
        how += f": {reason}" if reason else ""
        # What it did before it went, where its counters say it stopped short of the op
        short = seq is not None and not held.op.is_p2p and seq < held.op.seq
        return f"never entered it (seq {seq}), then {how}" if short else how
    if s.stuck is not None and is_stopped(s.stuck):
        return "stopped (SIGSTOP or a debugger): it runs nothing"
    last = f", last step {human_duration(now - s.last_step_at)} ago" if s.last_step_at and not final else ""
    # A step nobody counted (no optimizer step seen) is left out, not told as step 0
    step = f"step {s.step}{last}" if s.step or s.last_step_at else ""
    at = ", ".join(p for p in (f"seq {seq}" if seq is not None else "", step) if p)
    if not final and s.time and s.time < began:
        return f"not heard from since it began (last state {human_duration(now - s.time)} ago: {at})"
    return f"never entered it ({at})"


def _classes(graph: WaitGraph, victims: set[int]) -> list[list[int]]:
    """The victims in classes blocked alike (one op of one group, the same ranks waited for)."""
    classes: dict[tuple[str, int, str, frozenset[int]], list[int]] = defaultdict(list)
    for r in victims:
        w = graph.waits[r]
        classes[(w.group, w.op.seq, w.op.op, w.waits_for)].append(r)
    return sorted((sorted(ranks) for ranks in classes.values()), key=lambda ranks: ranks[0])


def _edges(graph: WaitGraph, victims: set[int]) -> list[WaitEdge]:
    return [WaitEdge(ranks=ranks, waits_for=sorted(graph.waits[ranks[0]].waits_for),
                     op=_where(graph.waits[ranks[0]], graph)) for ranks in _classes(graph, victims)]


def _edge_lines(graph: WaitGraph, victims: set[int]) -> list[str]:
    """'ranks 0-5 wait in all_reduce #41 of group 2 (ranks 4-7) for rank 7', one line per class."""
    lines = []
    for ranks in _classes(graph, victims):
        w = graph.waits[ranks[0]]
        waits_for = w.waits_for
        whom = ("" if w.op.is_p2p else f" for {ranks_text(waits_for)}" if waits_for
                else " for no one it could name")
        verb = "waits" if len(ranks) == 1 else "wait"
        lines.append(f"{ranks_text(ranks)} {verb} in {_where(w, graph, sizes=True)}{whom}, "
                     f"{human_duration(min(graph.waits[r].age for r in ranks))} (victims, not causes)")
    if len(lines) > MAX_EDGE_LINES:
        lines = [*lines[:MAX_EDGE_LINES], f"+{len(lines) - MAX_EDGE_LINES} more groups of waiting ranks"]
    return lines


def with_waiters(f: Finding, snapshot: JobSnapshot, now: float, config: DiagnosisConfig) -> Finding:
    """*f* (a certain mismatch), with the ranks blocked on its ranks as victims too, each class
    with its edge: the data-parallel ranks that wait for a tensor-parallel pair that diverged."""
    if not f.certain:
        return f
    graph = wait_graph(snapshot, now, config)
    more = graph.waiting_on(set(f.ranks) | set(f.victims)) - set(f.ranks) - set(f.victims)
    if not more:
        return f
    return msgspec.structs.replace(f, victims=sorted(set(f.victims) | more), waits=_edges(graph, more),
                                   evidence=[*f.evidence, *_edge_lines(graph, more)])


def _deadlock(graph: WaitGraph, cycle: list[int], now: float, config: DiagnosisConfig,
              final: bool) -> Finding | None:
    age = min(graph.waits[r].age for r in cycle)
    if not final and age < config.stall_s:
        return None
    edges = [f"rank {r} waits for {ranks_text(graph.waits[r].waits_for & set(cycle))} in "
             f"{_where(graph.waits[r], graph)}" for r in cycle]
    return Finding(kind="collective_deadlock", severity="critical", ranks=cycle,
                   waits=_edges(graph, set(cycle)),
                   title=f"deadlock: {'; '.join(edges[:4])}: they wait for each other and none can go on",
                   evidence=[*edges, f"waiting for {human_duration(age)}; no rank outside them holds them"],
                   remedy=REMEDY_DEADLOCK, since=now - age)


def all_stuck(snapshot: JobSnapshot, graph: WaitGraph, now: float, config: DiagnosisConfig) -> Finding | None:
    """Every rank inside the same collective, none missing, for long: the network, a P2P
    transport that never connects, or a huge all-gather on a slow link."""
    ranks = active(snapshot)
    waits = [graph.waits.get(s.rank) for s in ranks]
    if not ranks or any(w is None or w.waits_for or w.inferred or w.op.is_p2p for w in waits):
        return None
    keys = {(w.group, w.op.seq) for w in waits if w is not None}
    ops = {(w.op.op, tuple(map(tuple, w.op.sizes[0])) if w.op.sizes else ()) for w in waits if w is not None}
    if len(keys) != 1 or len(ops) != 1:
        return None  # different calls at one seq: collective_mismatch explains it
    first = next(w for w in waits if w is not None)
    age = min(w.age for w in waits if w is not None)
    seq = first.op.seq
    limit = config.first_collective_stall_s if seq <= 1 else config.all_stuck_s
    if age < limit:
        return None  # a young collective every rank is in: a slow save or a big all-gather
    where = _where(first, graph)
    evidence = [f"all {len(ranks)} ranks have been inside {where} for {human_duration(age)}"]
    utils = [s.gpu.util_percent for s in ranks if s.gpu and s.gpu.util_percent is not None]
    if utils:
        evidence.append(f"GPU busy {min(utils):.0f}-{max(utils):.0f}%")
    p2p = sorted({w for s in ranks if s.gpu for w in s.gpu.p2p.values()})
    if p2p:
        evidence.append("NVML P2P status: " + ", ".join(p2p))
    nccl = snapshot.job.backend == "nccl" or "nccl" in first.op.op.lower()
    if seq <= 1:
        evidence.append("no rank completed any collective")
        remedy = ("the first collective never completes: on nccl this is the P2P-transport signature; "
                  "export NCCL_P2P_DISABLE=1 and retry (NCCL_DEBUG=INFO shows the transport chosen)"
                  if nccl else
                  "check the network between the ranks (firewall, interface: GLOO_SOCKET_IFNAME)")
    else:
        remedy = ("every rank is inside the same collective and none completes: check the network and "
                  "NCCL_DEBUG=INFO output; a huge all-gather on a slow link can also take this long")
    critical = age >= config.all_stuck_critical_s or (seq <= 1 and nccl and bool(utils) and min(utils) >= 90)
    return Finding(kind="collective_stall", severity="critical" if critical else "warning",
                   ranks=sorted(s.rank for s in ranks),
                   title=f"all {len(ranks)} ranks stuck in {where} for {human_duration(age)}"
                   + (" (the first collective)" if seq <= 1 else ""),
                   evidence=evidence, remedy=remedy, since=now - age)
