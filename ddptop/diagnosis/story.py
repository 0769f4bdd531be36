"""One story: the first cause leads, what followed from it is told as its spread, never as a second cause.

Several rules see one hang or one death from their own evidence: gloo's size check, the
ranks' last collectives, the order in which ranks failed, NCCL's watchdog. Each alone
is right about what it saw; together they could blame different ranks for one event
("rank 1 failed first" where rank 1 is the victim of rank 2's skipped collective). Here,
among the findings that explain an event (a hang, a failure: :data:`EVENT_KINDS`, warning
or worse):

* the **lead** is the first finding, in rule order (root causes first: the engine's
  ``RULES``), that names its cause with certainty; else the first that names the collective
  itself; else the first;
* a finding that blames the **same ranks** in the same kind is the same verdict seen
  twice (one stopped rank holding up three groups): folded into the lead's evidence;
* a finding of the same rule as the lead that blames other ranks is another event of its
  own (two hosts lost): kept;
* any other finding that blames other ranks, or no rank, is **how it spread**: told in the
  lead's evidence, its ranks added to the lead's ``victims``, and kept below as ``info``
  with the words "consequence of the first cause";
* one that blames a subset of the lead's culprits agrees with it (a crashed rank's own
  failure beside "ranks 0-2 wait for rank 3"): kept.

Pure: findings in, findings out.
"""

from __future__ import annotations

import msgspec

from ddptop.diagnosis.finding import Finding

EVENT_KINDS = frozenset(("collective_mismatch", "collective_stall", "rank_lost", "node_lost",
                         "rank_unresponsive", "host_unreachable", "collective_deadlock"))
MAX_SPREAD = 16  # lines of "how it spread" added to the lead
CONSEQUENCE = "consequence of the first cause: "


def culprits(f: Finding) -> set[int]:
    """The ranks *f* blames: its ranks less its victims."""
    return set(f.ranks) - set(f.victims)


def blames(f: Finding) -> bool:
    """True where *f* names a cause with certainty at warning or worse (what precision counts)."""
    return f.certain and f.at_least("warning") and bool(culprits(f))


def one_story(found: list[tuple[int, Finding]]) -> list[tuple[int, Finding]]:
    """*found* (rule index, finding), most severe first, with one lead per event (see module)."""
    events = [(i, f) for i, f in found if f.kind in EVENT_KINDS and f.at_least("warning")]
    if len(events) < 2:
        return found
    lead_index, lead = _lead(events)
    blamed = culprits(lead)
    spread: list[str] = []
    victims = set(lead.victims)
    out: list[tuple[int, Finding]] = []
    for index, f in found:
        if f is lead or not (f.kind in EVENT_KINDS and f.at_least("warning")):
            out.append((index, f))
            continue
        theirs = culprits(f)
        if theirs and theirs == blamed and f.kind == lead.kind:
            spread.append(f"also: {f.title}")
            # its chain of waits ("rank 5 waits in recv ... for rank 1") is the path to the culprit
            spread += [line for line in f.evidence if " waits in " in line and line not in lead.evidence]
            victims |= set(f.victims)
        elif index == lead_index and theirs and f.certain:
            out.append((index, f))  # the lead's own rule saw another event (another host lost)
        elif theirs and blamed and theirs <= blamed and f.certain:
            out.append((index, f))  # agrees: the culprit's own failure
        else:
            spread.append(f"how it spread: {f.title}")
            victims |= (set(f.ranks) | set(f.victims)) - blamed
            out.append((index, msgspec.structs.replace(
                f, severity="info", title=(CONSEQUENCE + f.title)[:600],
                victims=sorted(set(f.victims) | (set(f.ranks) - blamed)))))
    if spread or victims != set(lead.victims):
        told = lead.evidence + spread[:MAX_SPREAD]
        if len(spread) > MAX_SPREAD:
            told.append(f"+{len(spread) - MAX_SPREAD} more")
        merged = msgspec.structs.replace(lead, evidence=told, victims=sorted(victims - blamed))
        out = [(i, merged if f is lead else f) for i, f in out]
    return out


def _lead(events: list[tuple[int, Finding]]) -> tuple[int, Finding]:
    """The finding that tells the event: certain with a culprit, else certain naming the
    collective (no rank), else the first; rule order within each."""
    ordered = sorted(events, key=lambda item: item[0])
    for index, f in ordered:
        if f.certain and culprits(f):
            return index, f
    for index, f in ordered:
        if f.certain and not f.ranks:
            return index, f
    return ordered[0]
