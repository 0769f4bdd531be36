"""The sets of ``bench/frdump_vs_torchfrtrace.py`` with their truth, and the precision/recall table.

A set is a folder of Flight Recorder dumps or a log file, with the ranks that are its culprits and the
ranks known healthy. Truth files: ``tests/data/fr_moe/truth.json`` is ``{"scenario": {"culprits": [..],
"healthy": [..]}}`` for the folders ``tests/data/fr_moe/<scenario>/`` (no ``healthy``: all other ranks;
keys such as ``_about`` are notes); ``tests/data/logs/truth.json`` is
``{"file.log": {"culprits": [..], "healthy": [..], ...}}`` for ``tests/data/logs/*.log``;
``tests/data/nvrx_fr/truth.json`` is the MoE form for NVIDIA's real NCCL sets (its SOURCE.md).

Scoring, per tool over the sets it can read (the FR tools do not read logs): a true positive is a culprit
it names, a false positive a healthy rank it names; recall = TP / culprits, precision = TP / (TP + FP).
A tool that fails on a set names nothing there: its culprits count against its recall. A tool that
cannot be run here at all (not installed) is left out, its total row says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from frtools import Run, dump_ranks


@dataclass
class Case:
    """One set and what is known of it (culprits None: nothing, it is only listed)."""

    name: str
    family: str  # real, generated, moe, log, own
    target: Path
    culprits: set[int] | None
    healthy: set[int] | None
    world: int = 0


def load_truth(folder: Path) -> tuple[dict[str, dict[str, object]], str]:
    """``truth.json`` of *folder*, or {} and why not."""
    path = folder / "truth.json"
    if not path.is_file():
        return {}, f"no sets in {folder} (no truth.json)" if folder.is_dir() else f"no sets in {folder}"
    try:
        truth = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {}, f"no sets in {folder} ({path.name} unreadable: {exc})"
    if not isinstance(truth, dict):
        return {}, f"no sets in {folder} ({path.name} is not an object)"
    return truth, ""


def ranks_of(entry: dict[str, object], key: str) -> set[int]:
    return {int(r) for r in entry.get(key) or []}  # type: ignore[attr-defined]


def scenarios(truth: dict[str, object]) -> dict[str, dict[str, object]]:
    """The entries that are sets: keys such as ``_about`` and values without ``culprits`` are notes."""
    return {key: entry for key, entry in truth.items()
            if not key.startswith("_") and isinstance(entry, dict) and "culprits" in entry}


def moe_cases(folder: Path, family: str = "moe") -> tuple[list[Case], list[str]]:
    """The dump sets of *folder* that have a truth entry and dumps (our generated MoE sets, or
    NVIDIA's real NCCL sets in tests/data/nvrx_fr); notes for the rest."""
    truth, why = load_truth(folder)
    if why:
        return [], [why]
    cases, notes = [], []
    for scenario, entry in sorted(scenarios(truth).items()):
        sub = folder / scenario
        ranks = dump_ranks(sub)[1] if sub.is_dir() else set()
        if not ranks:
            notes.append(f"{sub}: no dumps yet")
            continue
        culprits, healthy = ranks_of(entry, "culprits"), ranks_of(entry, "healthy")
        world = max(ranks | culprits | healthy | ranks_of(entry, "dumps")) + 1
        if "healthy" not in entry:  # "healthy = the others" (its _about)
            healthy = set(range(world)) - culprits
        cases.append(Case(f"{family}/{scenario} ({world} ranks)", family, sub, culprits, healthy, world))
    untruthed = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name not in scenarios(truth))
    if untruthed:
        notes.append(f"{folder}: no truth for {', '.join(untruthed)}")
    return cases, notes


def log_cases(folder: Path) -> tuple[list[Case], list[str]]:
    """The logs that have a truth entry; notes for the rest."""
    truth, why = load_truth(folder)
    if why:
        return [], [why]
    cases, notes = [], []
    for name, entry in sorted(scenarios(truth).items()):
        path = folder / name
        if not path.is_file():
            notes.append(f"{path}: missing")
            continue
        culprits, healthy = ranks_of(entry, "culprits"), ranks_of(entry, "healthy")
        cases.append(Case(f"log/{name}", "log", path, culprits, healthy))
    untruthed = sorted(p.name for p in folder.glob("*.log") if p.name not in truth)
    if untruthed:
        notes.append(f"{folder}: no truth for {len(untruthed)} log(s): {', '.join(untruthed[:5])}")
    return cases, notes


def ranks_text(ranks: set[int]) -> str:
    shown = ",".join(map(str, sorted(ranks)[:8]))
    return "{" + shown + (f",… {len(ranks)} in all" if len(ranks) > 8 else "") + "}"


def ratio(num: int, den: int) -> str:
    return f"{num / den:.2f}" if den else "-"


@dataclass
class Tally:
    sets: int = 0
    culprits: int = 0
    tp: int = 0
    fp: int = 0
    failed: int = 0

    def add(self, culprits: set[int], healthy: set[int], named: set[int] | None) -> tuple[int, int]:
        tp = len(culprits & named) if named is not None else 0
        fp = len(healthy & named) if named is not None else 0
        self.sets += 1
        self.culprits += len(culprits)
        self.tp += tp
        self.fp += fp
        self.failed += named is None
        return tp, fp


def pr_table(results: list[tuple[Case, str, Run]], tools: list[str]) -> list[str]:
    """Markdown rows: one per (set, tool) with truth, then a total per tool and family and overall."""
    out = ["| set | tool | culprits | named | TP | FP (healthy named) | recall | precision | note |",
           "|---|---|---|---|---|---|---|---|---|"]
    totals: dict[tuple[str, str], Tally] = {}
    unavailable: dict[str, str] = {}
    for case, tool, run in results:
        if not run.available:
            unavailable.setdefault(tool, run.note)
            continue
        if case.culprits is None or case.healthy is None:
            continue
        tp, fp = Tally().add(case.culprits, case.healthy, run.named)
        for key in ((tool, case.family), (tool, "all")):
            totals.setdefault(key, Tally()).add(case.culprits, case.healthy, run.named)
        named = "-" if run.named is None else ranks_text(run.named)
        out.append(f"| {case.name} | {tool} | {ranks_text(case.culprits)} | {named} | {tp} | {fp} | "
                   f"{ratio(tp, len(case.culprits))} | {ratio(tp, tp + fp)} | {run.note} |")
    families = [f for f in ("real", "moe", "nvrx", "log", "generated") if any(k[1] == f for k in totals)]
    for tool in tools:
        if tool in unavailable and not any(k[0] == tool for k in totals):
            out.append(f"| **total** | **{tool}** | | | | | | | {unavailable[tool]} |")
        for family in [*families, "all"] if len(families) > 1 else ["all"]:
            t = totals.get((tool, family))
            if t is None:
                continue
            failed = f"{t.failed} set(s) without an answer" if t.failed else ""
            recall, precision = ratio(t.tp, t.culprits), ratio(t.tp, t.tp + t.fp)
            out.append(f"| **total {family}** ({t.sets} sets) | **{tool}** | {t.culprits} | | **{t.tp}** | "
                       f"**{t.fp}** | **{recall}** | **{precision}** | {failed} |")
    return out
