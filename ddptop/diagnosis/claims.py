"""What a log's statements claim about who failed, ranked by strength, said with their source.

A console log holds statements of unequal weight. Some *name the culprit* themselves:
the monitored barrier's "... from rank N", a rank's own CUDA / ECC error, NCCL's
``Cuda failure`` in one process, the kernel's OOM killer naming a pid, NCCL's
"Got completion from peer ADDR" or "Connection closed by peer ADDR" (a link or a host,
not a rank). Others only say how a process ended (an exit status: read by
:mod:`ddptop.diagnosis.exit_reading`), and the order of lines in a file says nothing.

A :class:`Claim` is one such statement, read by :mod:`ddptop.evidence.log_claims`;
:func:`claim_findings` turns them into findings: ``certain`` only where a statement of
the first kind names one rank, or the whole job's evidence agrees (the same error on
several ranks is the environment's, not one rank's: said, not named). Pure.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.finding import Finding

# Strength: 0 names the culprit (a rank or a process); 1 names a place (a peer address, a
# GPU of a host) but no rank; 2 names ranks that share a set-up error (no culprit); 3 tells
# how launcher tasks ended (read like exit statuses).
NAMES_CULPRIT, NAMES_PLACE, NAMES_SETUP, TELLS_EXIT = 0, 1, 2, 3

CUDA_REMEDY = ("the GPU of that rank reported the error: read its host's kernel log (dmesg | grep -i xid), "
               "`nvidia-smi -q -d ECC,PAGE_RETIREMENT`, and drain or reset that GPU before rerunning")
PEER_REMEDY = ("NCCL lost a connection: check the link and the host at that address (NCCL_DEBUG=INFO, "
               "`ibstat`, the switch's counters, that host's kernel log); a process that died there "
               "closes its connections too, so read that host's log first")
BARRIER_REMEDY = "read that rank's own log: it never answered the barrier (stuck, slower, or dead)"
SETUP_REMEDY = ("a launch configuration error: give each rank its own GPU (LOCAL_RANK -> cuda device), "
                "the same world size everywhere, and rerun")
TASKS_REMEDY = ("srun reports how its tasks ended, not why: read the task that exited first with a code "
                "(its own traceback), and `sacct -j JOB --format=JobID,State,ExitCode,NodeList` for the rest")


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """One statement of a log that says who (or where) failed."""

    kind: str  # "monitored_barrier", "cuda_error", "nccl_cuda_failure", "oom_killer", "xid",
    # "peer_address", "setup", "srun_tasks"
    strength: int
    culprits: list[int] = []  # global ranks the statement names at fault
    victims: list[int] = []  # ranks it shows waiting or failing because of them
    named: list[int] = []  # ranks it names without blame (a set-up error's pair)
    place: str = ""  # a host, a process, a peer address, a GPU: where, when no rank is known
    words: str = ""  # the statement in its own words, trimmed
    source: str = ""  # who said it: "PyTorch's monitored barrier (printed by rank 1)"


def claim_findings(claims: list[Claim]) -> list[Finding]:
    """The findings *claims* prove, strongest first (see the module)."""
    out: list[Finding] = []
    by_kind: dict[str, list[Claim]] = defaultdict(list)
    for claim in claims:
        by_kind[claim.kind].append(claim)
    for kind in sorted(by_kind, key=lambda k: (min(c.strength for c in by_kind[k]), k)):
        said = by_kind[kind]
        if kind == "monitored_barrier":
            out.append(_barrier(said))
        elif kind in ("cuda_error", "nccl_cuda_failure", "oom_killer", "xid"):
            out += _own_errors(said)
        elif kind == "peer_address":
            out.append(_peers(said))
        elif kind == "setup":
            out.append(_setup(said))
        elif kind == "srun_tasks":
            out.append(_tasks(said))
    return out


def _evidence(claims: list[Claim], limit: int = 8) -> list[str]:
    return [f"{c.source}: {c.words}" for c in claims[:limit]]


def _barrier(claims: list[Claim]) -> Finding:
    culprits = sorted({r for c in claims for r in c.culprits})
    victims = sorted({r for c in claims for r in c.victims} - set(culprits))
    # Two ranks blaming each other (pytorch#83289's "circular blame") prove neither.
    circular = bool(set(culprits) & {r for c in claims for r in c.victims})
    title = (f"{ranks_text(culprits)} never answered PyTorch's monitored barrier: "
             f"{ranks_text(victims) if victims else 'the others'} reached it and waited "
             f"({claims[0].source})")
    if circular:
        title = (f"{ranks_text(culprits)} blame each other in the monitored barrier: which one stopped "
                 "cannot be told")
    # The rank that printed the report reached the barrier and waited: a victim, never among the
    # certain finding's ranks (#53). Circular blame proves no one: every rank named stays named.
    ranks = sorted(set(culprits) | set(victims)) if circular else culprits
    return Finding(kind="collective_stall", severity="critical", ranks=ranks,
                   victims=victims, certain=not circular, title=title, evidence=_evidence(claims),
                   remedy=BARRIER_REMEDY)


def _own_errors(claims: list[Claim]) -> list[Finding]:
    """A rank's own hardware / CUDA error: that rank, where one rank has it; the same words on
    several ranks are the environment's (a driver, a library), said without a culprit."""
    ranked = [c for c in claims if c.culprits]
    out: list[Finding] = []
    if ranked:
        ranks = sorted({r for c in ranked for r in c.culprits})
        first = ranked[0]
        if len(ranks) == 1:
            out.append(Finding(kind="rank_lost", severity="critical", ranks=ranks, certain=True,
                               title=(f"{ranks_text(ranks)} hit its own GPU error: {first.words} "
                                      f"({first.source})"),
                               evidence=_evidence(ranked), remedy=CUDA_REMEDY))
        else:
            out.append(Finding(kind="rank_lost", severity="warning", ranks=ranks, certain=False,
                               title=(f"{ranks_text(ranks)} all report {first.words}: the same error on "
                                      "several ranks points at their common environment (driver, CUDA, "
                                      "NCCL build, a shared host) more than at one rank"),
                               evidence=_evidence(ranked), remedy=CUDA_REMEDY))
    placed = [c for c in claims if not c.culprits]
    if placed:
        where = sorted({c.place for c in placed if c.place})
        first = placed[0]
        there = f" on {', '.join(where[:4])}" if where else ""
        out.append(Finding(kind="rank_lost", severity="warning", ranks=[], certain=False,
                           title=(f"{first.words}{there} ({first.source}); no line says which rank it was"),
                           evidence=[*_evidence(placed), "a [rankN]: prefix (torchrun --tee 3, torch >= "
                                     "2.2's default), srun -l or the ranks' own logs would tell which rank"],
                           remedy=CUDA_REMEDY))
    return out


def _peers(claims: list[Claim]) -> Finding:
    places = sorted({c.place for c in claims if c.place})
    victims = sorted({r for c in claims for r in c.victims})
    where = ", ".join(places[:4]) + (f" and {len(places) - 4} more" if len(places) > 4 else "")
    reporter = f"{ranks_text(victims)} lost" if victims else f"{claims[0].source.split(' in ')[0]} lost"
    return Finding(kind="host_unreachable", severity="warning", ranks=victims, victims=victims, certain=False,
                   title=(f"{reporter} its connection to {where}: a link or the host at that address "
                          f"({claims[0].source}); no rank is named by it"),
                   evidence=_evidence(claims), remedy=PEER_REMEDY)


def _setup(claims: list[Claim]) -> Finding:
    named = sorted({r for c in claims for r in c.named})
    return Finding(kind="rank_lost", severity="warning", ranks=named, certain=False,
                   title=(f"{claims[0].words} ({claims[0].source}): a set-up error of the launch, "
                          "no rank's fault"),
                   evidence=_evidence(claims), remedy=SETUP_REMEDY)


def _tasks(claims: list[Claim]) -> Finding:
    coded = [c for c in claims if "exit code" in c.words]
    lead = coded[0] if coded else claims[0]
    return Finding(kind="rank_lost", severity="warning", ranks=[], certain=False,
                   title=(f"srun: {lead.words} on {lead.place}; {len(claims)} line(s) of srun's own: how "
                          "its tasks ended, not why"),
                   evidence=_evidence(claims), remedy=TASKS_REMEDY)
