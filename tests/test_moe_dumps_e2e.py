"""The MoE-like dumps made again by torch's own writer, today's torch (#33): tests/data/fr_moe
is what ``probes/moe_groups.py`` left once; this runs it for real (8 gloo ranks under
``ddptop launch -- torchrun``, tp/ep/dp groups, all_to_all_single with uneven splits, rank 2
stopped before an ep all_to_all) so a change of torch's writer shows here, not in a user's
hands; and reads it live first, as the wait-for graph must tell the same story (#45).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from ddptop.evidence import frdump
from tests.jobs import JobRunner, ddptop_cmd, wait_until

pytestmark = pytest.mark.slow

def test_a_rank_stopped_in_its_expert_group_is_named_not_the_uneven_all_to_all(job_runner: JobRunner) -> None:
    """One job, read three ways with one story (#45): live while it hangs, then its dumps in the
    job's record (``doctor JOB``), then the dump files alone (``doctor DUMPS/``)."""
    job = job_runner.start("moe_groups", nproc=8, interval=0.5, launch_args=[],
                           env={"PROBE_SCENARIO": "stop_ep", "PROBE_DUMP_AFTER_S": "25"})
    found: list[dict[str, Any]] = []

    def named_live() -> bool:
        res = job.run_cli("doctor", "--json", job.job_id, timeout=60)
        found[:] = json.loads(res.stdout or '{"findings": []}')["findings"]
        # every other rank a victim: the dp ranks' waits show once their own groups stood still
        return any(f["kind"] == "collective_stall" and f["ranks"] == [2] and len(f["victims"]) == 7
                   for f in found)

    wait_until(named_live, 120.0, "rank 2 named live, the seven others its victims")
    check_story(found, live=True)
    job.wait(timeout=120)
    record = job.runtime_dir / "jobs" / job.job_id
    ranks = sorted(int(p.name.rsplit("_", 1)[1]) for p in record.glob("fr_trace_rank_*"))
    assert ranks == list(range(8)), (ranks, job.log()[-2000:])
    # torch's writer recorded the ep group's all_to_all with each rank's own sizes.
    sizes = {}
    for r in (0, 1, 3):
        dump = frdump.read_dump(record / f"fr_trace_rank_{r}")
        a2a = [op for op in dump.entries if op.op == "gloo:all_to_all" and op.pg_name == "5"
               and op.input_sizes and len(op.input_sizes[0]) == 2]
        assert a2a, [op.op for op in dump.entries]
        sizes[r] = a2a[-1].input_sizes
    assert len({repr(s) for s in sizes.values()}) > 1, sizes
    after = job.run_cli("doctor", "--json", job.job_id, timeout=120)
    check_story(json.loads(after.stdout)["findings"], live=False)
    dumps = job_runner.tmp / "dumps"
    dumps.mkdir()
    for p in record.glob("fr_trace_rank_*"):
        (dumps / p.name).write_bytes(p.read_bytes())
    res = subprocess.run(ddptop_cmd("doctor", "--json", str(dumps)), capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    check_story(json.loads(res.stdout)["findings"], live=False)


def check_story(findings: list[dict[str, Any]], live: bool) -> None:
    """Rank 2 alone, as the end of every wait; the other seven its victims; no mismatch read
    into the uneven all_to_all."""
    bad = [f for f in findings if f["severity"] != "info"]
    if live:
        assert [(f["kind"], f["ranks"]) for f in bad] == [("collective_stall", [2])], findings
    else:  # after the end its last words add how it went; still rank 2 alone
        assert {r for f in bad for r in set(f["ranks"]) - set(f["victims"])} == {2}, findings
    stall = next(f for f in bad if f["kind"] == "collective_stall")
    assert stall["ranks"] == [2] and sorted(stall["victims"]) == [0, 1, 3, 4, 5, 6, 7], stall
    # Rank 2 holds up its ep group (where it stopped) and, through it, the dp groups: one
    # finding, every wait told as a victim's edge.
    told = " ".join([stall["title"], *stall["evidence"]])
    assert "all_to_all" in told and "group 5 ep" in told, stall
    # the uneven all_to_all is healthy: no mismatch blames anyone but the stopped rank
    assert not any(f["kind"] == "collective_mismatch" and set(f["ranks"]) - set(f["victims"]) != {2}
                   for f in findings), findings
