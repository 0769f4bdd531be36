"""The MoE-like dumps made again by torch's own writer, today's torch (#33): tests/data/fr_moe
is what ``probes/moe_groups.py`` left once; this runs it for real (8 gloo ranks under
torchrun, tp/ep/dp groups, all_to_all_single with uneven splits, rank 2 stopped before an ep
all_to_all) so a change of torch's writer shows here, not in a user's hands.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ddptop.evidence import frdump
from tests.frdumps import run_dump_probe
from tests.jobs import ddptop_cmd

pytestmark = pytest.mark.slow

def test_a_rank_stopped_in_its_expert_group_is_named_not_the_uneven_all_to_all(tmp_path: Path) -> None:
    dumps = run_dump_probe(tmp_path, "moe_groups.py", 8, {"PROBE_SCENARIO": "stop_ep"})
    ranks = sorted(int(p.name.rsplit("_", 1)[1]) for p in dumps.iterdir())
    assert ranks == list(range(8)), (ranks, (tmp_path / "torchrun.log").read_text()[-2000:])
    # torch's writer recorded the ep group's all_to_all with each rank's own sizes.
    sizes = {}
    for r in (0, 1, 3):
        dump = frdump.read_dump(dumps / f"comm_lib_trace_rank_{r}")
        a2a = [op for op in dump.entries if op.op == "gloo:all_to_all" and op.pg_name == "5"
               and op.input_sizes and len(op.input_sizes[0]) == 2]
        assert a2a, [op.op for op in dump.entries]
        sizes[r] = a2a[-1].input_sizes
    assert len({repr(s) for s in sizes.values()}) > 1, sizes
    res = subprocess.run(ddptop_cmd("doctor", "--json", str(dumps)), capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    findings = json.loads(res.stdout)["findings"]
    bad = [f for f in findings if f["severity"] != "info"]
    assert [(f["kind"], f["ranks"]) for f in bad] == [("collective_stall", [2])], findings
    # Rank 2 holds up its ep group (where it stopped) and, through it, the dp groups: one
    # finding, whichever wait it leads with (the waits began within milliseconds).
    told = " ".join([bad[0]["title"], *bad[0]["evidence"]])
    assert "all_to_all" in told and "group 5 ep" in told, bad[0]
    assert not any(f["kind"] == "collective_mismatch" for f in findings), findings
