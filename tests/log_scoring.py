"""How `ddptop doctor LOG` is scored on a folder of real logs with their truth (#33, #46).

A log is **right** when the ranks named with certainty at warning or worse (``blames``) are
exactly what the truth can hold: every culprit named and nothing else where the thread
singles out ranks; nothing named where it singles out none. **False** counts the logs that
name a healthy rank with certainty. **Exit 2** counts the logs the CLI would refuse (a
DdptopError out of reading them). Shared by the corpus tests and bench/score_logs.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddptop.bundle.reader import build_model, end_time
from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.story import blames, culprits
from ddptop.errors import DdptopError
from ddptop.evidence.scan import load_evidence


@dataclass
class Scored:
    """One log's result."""

    name: str
    named: set[int]
    right: bool
    false: bool
    exit2: bool
    titles: list[str]


def truth_of(folder: Path) -> dict[str, dict[str, Any]]:
    truth = json.loads((folder / "truth.json").read_text())
    return {k: v for k, v in truth.items() if not k.startswith("_") and isinstance(v, dict)}


def diagnose_path(path: Path) -> list[Finding]:
    contents = load_evidence([path])
    return findings_for_model(build_model(contents), end_time(contents), claims=contents.log_claims)


def named(findings: list[Finding]) -> set[int]:
    """The ranks blamed with certainty at warning or worse (what precision counts)."""
    return {r for f in findings if blames(f) for r in culprits(f)}


def score_one(folder: Path, name: str, truth: dict[str, Any]) -> Scored:
    try:
        findings = diagnose_path(folder / name)
    except DdptopError:
        return Scored(name, set(), not truth.get("culprits"), False, True, [])
    blamed = named(findings)
    want = set(truth.get("culprits") or [])
    false = bool(blamed & set(truth.get("healthy") or []))
    right = not false and blamed == want if want else not blamed
    return Scored(name, blamed, right, false, False, [f.title for f in findings])


def score(folder: Path) -> list[Scored]:
    """Every log of *folder* scored against its truth.json."""
    truth = truth_of(folder)
    return [score_one(folder, name, truth[name]) for name in sorted(truth) if (folder / name).is_file()]
