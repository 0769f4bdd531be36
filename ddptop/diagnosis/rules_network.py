"""A network partition, named by host: ``host_unreachable``.

The commonest multi-node failure closes no connection: a cable, a switch port or a firewall
rule cuts a host off, its ranks and node agent live on, and the ranks elsewhere wait in
their next collective until its timeout. What proves it is the node agent's silence with its
connection open (or a connect nobody answers, refused by nobody): the viewer's probe
(:mod:`ddptop.client.reachability`) or this node's agent, whose beats from that host stopped
(:mod:`ddptop.agent.exchange`), puts those ranks in ``job.unreachable_since`` with when the
host was last heard from. The finding names the host (its name and address, from the job's
store), the time and whose verdict it is (a node agent's: "as host-a's agent saw it", a viewer
that began after the cut knows the time from it), its ranks, the ranks here that wait for
them, and where to look.

Seen from the host that was cut off, every other host is unreachable at once: then the
finding says so, and that this host's own link (or its switch port) is the likely cut. (A
dead switch cuts every host off from every other: each side then says the same of itself,
which is true of each.) Ranks whose ending is known are not unreachable: their end is told
by the post-mortem rules.
"""

from __future__ import annotations

import time
from collections import defaultdict

from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.status import ENDED
from ddptop.textfmt import human_duration

MAX_REASON = 300


def host_unreachable(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                     config: DiagnosisConfig) -> list[Finding]:
    """Each host whose node agent cannot be reached from here, with its ranks and since when."""
    cut = snapshot.job.unreachable_since
    if not cut:
        return []
    by_rank = snapshot.by_rank()
    hosts: dict[str, list[int]] = defaultdict(list)
    for rank in sorted(cut):
        state = by_rank.get(rank)
        if state is None or state.status not in ENDED:
            hosts[_host(snapshot, rank, state)].append(rank)
    if not hosts:
        return []
    heard = [s for s in snapshot.ranks if s.rank not in cut and s.status not in ENDED]
    here = {s.host for s in heard if s.host}
    waiting = _waiting(heard)
    if len(here) == 1 and len(hosts) >= 2:  # every other host at once: this side was cut off
        (own,) = here
        ranks = sorted(r for rs in hosts.values() for r in rs)
        since = _since(cut, ranks)
        parts = ", ".join(f"{host} ({ranks_text(rs)})" for host, rs in sorted(hosts.items()))
        return [Finding(
            kind="host_unreachable", severity="critical", ranks=ranks,
            title=(f"every other host unreachable from {own} since {_clock(since)}: {parts}; "
                   f"{own}'s own link (or its switch port) is the likely cut"),
            evidence=_evidence(snapshot, ranks, since, now, waiting),
            remedy=(f"check {own}'s own network first (`ip link`, its cable, its switch port): every other "
                    "host went silent at once; where they still talk to each other, it is this host "
                    "that was cut off"),
            since=since or None)]
    out: list[Finding] = []
    for host, ranks in sorted(hosts.items()):
        since = _since(cut, ranks)
        seen = next((by for r in ranks if (by := snapshot.job.unreachable_seen_by.get(r))), "")
        told = f", as {seen}'s agent saw it" if seen and since else ""
        out.append(Finding(
            kind="host_unreachable", severity="critical", ranks=ranks,
            title=(f"host {_named(snapshot, host, ranks)} unreachable since {_clock(since)}{told}: "
                   f"{ranks_text(ranks)}"),
            evidence=_evidence(snapshot, ranks, since, now, waiting),
            remedy=(f"check {host}'s network (its link: `ip link` there, the cable, its switch port) and "
                    "whether the host answers at all (ping, its BMC); its ranks may still be running, "
                    "and those here fail at the collective's timeout: restart without it, or once its "
                    "link is back"),
            since=since or None))
    return out


def _host(snapshot: JobSnapshot, rank: int, state: RankState | None) -> str:
    if state is not None and state.host:
        return state.host
    return snapshot.job.nodes.get(rank) or snapshot.job.addresses.get(rank) or "?"


def _named(snapshot: JobSnapshot, host: str, ranks: list[int]) -> str:
    """'host-c (192.0.2.13)': the host's name and the address the job's store gave its ranks."""
    address = next((a for r in ranks if (a := snapshot.job.addresses.get(r))), "")
    return f"{host} ({address})" if address and address != host else host


def _since(cut: dict[int, float], ranks: list[int]) -> float:
    """When the host was last heard from: its ranks' latest (0: never, from here)."""
    return max((cut[r] for r in ranks), default=0.0)


def _clock(since: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(since)) if since else "before this viewer began"


def _waiting(heard: list[RankState]) -> str:
    """The ranks heard from that wait in a collective, in which (the first seen), and that they
    cannot finish it."""
    ranks, what = [], ""
    for s in heard:
        pending = next((op for g in s.collectives for op in g.pending), None)
        if pending is not None:
            ranks.append(s.rank)
            what = what or f"{pending.op} #{pending.seq}"
    if not ranks:
        return ""
    wait, they = ("waits", "it") if len(ranks) == 1 else ("wait", "they")
    return f"{ranks_text(ranks)} {wait} in {what}: {they} cannot finish"


def _evidence(snapshot: JobSnapshot, ranks: list[int], since: float, now: float, waiting: str) -> list[str]:
    reason = snapshot.job.unreachable.get(ranks[0], "")
    address = snapshot.job.addresses.get(ranks[0], "")
    out = [reason[:MAX_REASON]] if reason else []
    if since:
        out.append(f"last heard from {human_duration(max(0.0, now - since))} ago"
                   + (f", at {address}" if address else ""))
    elif address:
        out.append(f"never reached from here, at {address}")
    if waiting:
        out.append(f"{waiting} without {ranks_text(ranks)}")
    return out
