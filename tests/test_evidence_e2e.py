"""Any job's evidence (#19): real Flight Recorder dumps and torchrun's files, read by doctor/replay/export.

Every dump set here is written by a real 4-rank torchrun job with torch's own writers
(``probes/fr_dumps.py``); each plants one culprit, and each test asserts that the culprit
and only the culprit is named, from dumps alone, from dumps with torchrun's log, and from
a job under ``ddptop launch`` whose NCCL-style dumps land in its record.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddptop.evidence import frdump
from tests.frdumps import CULPRIT, SCENARIOS, fr_dump_set
from tests.jobs import JobRunner, ddptop_cmd

# One worker runs them all (make test: --dist loadgroup): the dump sets they share are made
# once a session, by one job per scenario.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("frdumps")]


def doctor(*paths: Path | str, rc: int = 1) -> list[dict[str, Any]]:
    res = subprocess.run(ddptop_cmd("doctor", "--json", *map(str, paths)), capture_output=True, text=True,
                         timeout=60, check=False, stdin=subprocess.DEVNULL)
    assert res.returncode == rc, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    return list(json.loads(res.stdout)["findings"])


def named(findings: list[dict[str, Any]]) -> set[int]:
    """Every rank any finding of warning or worse names as a rank to look at."""
    return {r for f in findings if f["severity"] != "info" for r in f["ranks"]}


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_culprit_and_only_the_culprit_from_dumps(tmp_path_factory: pytest.TempPathFactory,
                                                  scenario: str, fmt: str) -> None:
    dumps = fr_dump_set(tmp_path_factory, scenario, fmt)
    for path in dumps.iterdir():
        dump = frdump.read_dump(path)
        assert dump.format == fmt and dump.backend == "gloo" and dump.entries
        assert dump.rank == int(path.name.rsplit("_", 1)[1])
    findings = doctor(dumps)
    assert named(findings) == set(CULPRIT[scenario]), findings
    kinds = {f["kind"] for f in findings}
    assert kinds == ({"collective_mismatch"} if scenario == "op" else {"collective_stall"}), findings
    text = json.dumps(findings)
    if scenario == "killed":
        assert "left no dump" in text
    if scenario == "subgroup":
        assert "group 1" in text and "rank 0 waits in all_reduce" in text  # the chain, as evidence


def test_dumps_with_torchruns_log_name_the_killed_rank_and_the_victims(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    dumps = fr_dump_set(tmp_path_factory, "killed")
    findings = doctor(dumps, dumps.parent / "torchrun.log")
    assert named(findings) == {1}, findings
    lost = next(f for f in findings if f["kind"] == "rank_lost")
    assert lost["ranks"][0] == 1 and "SIGKILL" in lost["title"]


def test_replay_and_export_of_dumps(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    dumps = fr_dump_set(tmp_path_factory, "subgroup")
    info = subprocess.run(ddptop_cmd("replay", "--info", str(dumps)), capture_output=True, text=True,
                          timeout=60, check=False)
    assert info.returncode == 0, info.stderr
    assert "4 ranks" in info.stdout and "0=stale" in info.stdout
    bundle = tmp_path / "hang.ddptop"
    res = subprocess.run(ddptop_cmd("export", "-o", str(bundle), str(dumps)), capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0 and bundle.stat().st_size > 0, res.stderr
    assert named(doctor(bundle)) == {1}  # the bundle tells what the dumps told


def test_a_damaged_dump_is_one_warning_and_the_rest_is_analysed(tmp_path_factory: pytest.TempPathFactory,
                                                                 tmp_path: Path) -> None:
    dumps = fr_dump_set(tmp_path_factory, "skip")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for path in dumps.iterdir():
        data = path.read_bytes()
        (mixed / path.name).write_bytes(data[: len(data) // 2] if path.name.endswith("_2") else data)
    res = subprocess.run(ddptop_cmd("doctor", "--json", str(mixed)), capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("ddptop: warning:")]
    assert len(warnings) == 1 and "comm_lib_trace_rank_2" in warnings[0], res.stderr
    findings = json.loads(res.stdout)["findings"]
    assert named(findings) == {1}  # rank 2's dump is gone, the culprit is still rank 1


def test_launch_puts_nccl_dumps_into_the_record(job_runner: JobRunner) -> None:
    """Under ddptop launch the dumps land in the job's record; doctor JOB reads them after the end."""
    job = job_runner.start("fr_dumps", nproc=4, env={"PROBE_SCENARIO": "skip", "PROBE_DUMP_AFTER_S": "4"},
                           launch_args=[])
    job.wait(timeout=120)
    record = job.runtime_dir / "jobs" / job.job_id
    dumps = sorted(p.name for p in record.glob("fr_trace_rank_*"))
    assert dumps == [f"fr_trace_rank_{r}" for r in range(4)], (dumps, job.log()[-2000:])
    res = job.run_cli("doctor", "--json", job.job_id, timeout=60)
    assert res.returncode == 1, res.stderr
    findings = json.loads(res.stdout)["findings"]
    stall = [f for f in findings if f["kind"] == "collective_stall"]
    assert stall and stall[0]["ranks"] == [1], findings


def test_launch_keeps_the_jobs_stderr_and_names_a_cxx_abort_by_its_words(job_runner: JobRunner) -> None:
    """A C++ abort leaves no Python last words; its what() line, in the job's stderr, says why."""
    job = job_runner.start("size_mismatch", nproc=2)
    job.wait(timeout=120)
    console = job.runtime_dir / "jobs" / job.job_id / "console.log"
    assert "what():" in console.read_text(errors="replace"), job.log()[-3000:]
    assert "what():" in job.log()  # passed through to launch's own stderr as well
    res = job.run_cli("doctor", "--json", job.job_id, timeout=60)
    assert res.returncode == 1, res.stderr
    lost = next(f for f in json.loads(res.stdout)["findings"] if f["kind"] == "rank_lost")
    assert lost["ranks"][0] == 0 and "died of SIGABRT (gloo enforce failed" in lost["title"], lost
    assert "vs 4" in lost["title"] and "\n" not in lost["title"], lost


def test_dashboard_replays_dumps_at_the_last_moment(tmp_path_factory: pytest.TempPathFactory) -> None:
    """replay of a folder of dumps: every rank in the table, the culprit in the findings panel,
    the groups' members and last ops in the rank detail."""
    import asyncio

    from textual.widgets import Static

    from ddptop.bundle.replay_source import ReplaySource
    from ddptop.evidence.scan import load_evidence
    from ddptop.tui.app import DdptopApp
    from ddptop.tui.widgets.rank_table import RankTable

    dumps = fr_dump_set(tmp_path_factory, "subgroup")
    source = ReplaySource(load_evidence([dumps]))

    async def go() -> None:
        app = DdptopApp(source, clock=lambda: source.end_time)
        async with app.run_test(size=(160, 45)) as pilot:
            table = app.query_one(RankTable)
            for _ in range(100):
                if len(table.shown_rows) == 4:
                    break
                await pilot.pause(0.05)
            assert sorted(r.rank for r in table.shown_rows) == [0, 1, 2, 3]
            for _ in range(100):
                findings = str(app.query_one("#findings", Static).render())
                if "never entered" in findings:
                    break
                await pilot.pause(0.05)
            # One story, as live: the waits end at rank 1, and rank 0's own wait is told as a victim's
            assert "end at rank 1: rank 1 never entered gloo:all_reduce #3" in findings, findings
            # The culprit's row leads, marked CAUSE; rank 0 says whom it waits for
            assert [r.rank for r in table.shown_rows] == [1, 0, 2, 3]
            assert table.story[1] == "CAUSE" and table.story[0] == "→?", table.story
            await pilot.press("down", "enter")  # the detail of rank 0: waiting in group 1

            def detail_text() -> str:
                return "\n".join(str(w.render()) for w in app.screen.query(Static))

            for _ in range(100):
                if "group 1" in detail_text():
                    break
                await pilot.pause(0.05)
            detail = detail_text()
            assert "group 1" in detail and "pending gloo:all_reduce #1 [64] float32" in detail, detail[-1500:]
            assert "done    gloo:all_reduce #2" in detail  # what led there: the default group's last ops

    asyncio.run(go())
