"""No certain finding names its own victim, on every piece of real evidence the suite keeps (#53).

A rank that only reported a wait (a monitored barrier's reporter, a rank blocked in a
collective, a watchdog that timed out on a peer) is a victim: it may stand in a finding's
``victims``, never among the ranks a certain finding blames. Checked on every public log, every
Flight Recorder dump set and every bundle under tests/data, whichever reader produced the
finding (log claims, dumps, recordings).
"""

from __future__ import annotations

from pathlib import Path

from ddptop import api
from ddptop.errors import DdptopError

DATA = Path(__file__).parent / "data"
DUMP_SETS = ("nvrx_fr", "fr_moe", "nccl_h100")


def _evidence() -> list[Path]:
    logs = sorted(DATA.rglob("*.log"))
    dumps = [p for d in DUMP_SETS for p in sorted((DATA / d).iterdir()) if p.is_dir()]
    return logs + dumps + sorted(DATA.glob("*.ddptop"))


def test_no_certain_finding_blames_a_rank_it_calls_a_victim() -> None:
    read, bad = 0, []
    for path in _evidence():
        try:
            findings = api.read_evidence(path).findings.findings
        except DdptopError:  # a file that is evidence only beside others (a dump set's torchrun.log)
            continue
        read += 1
        bad += [(path.name, f.kind, f.ranks, f.victims) for f in findings
                if f.certain and set(f.ranks) & set(f.victims)]
    assert read >= 140, read  # the suite's real evidence, not an empty glob
    assert bad == [], bad
