"""Real Flight Recorder dump sets, made by real torchrun jobs (probes/fr_dumps.py), once a session.

``fr_dump_set(tmp_factory, scenario, fmt)`` runs the scenario's 4-rank gloo job, in a
session of its own, bounded, and returns the folder holding its dumps in that format (the
run writes both: the tests of one module share it, on one xdist worker: ``xdist_group``) and torchrun's
console log (``torchrun.log``, kept beside the dumps in a sibling folder so that a folder
of dumps alone stays a folder of dumps). The culprit each scenario plants is ``CULPRIT``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ddptop.proctree import stop_tree
from tests.jobs import BIN, PROBES

SCENARIOS = ("skip", "op", "killed", "subgroup")
CULPRIT = {"skip": [1], "op": [2], "killed": [1], "subgroup": [1]}
RUN_TIMEOUT_S = 120.0
_made: dict[tuple[str, str], Path] = {}


def run_dump_probe(base: Path, probe: str, nproc: int, env: dict[str, str]) -> Path:
    """Run a dump probe under torchrun (its own session, bounded, stopped whatever happens);
    its dumps land in ``<base>/dumps`` (returned), its console in ``<base>/torchrun.log``."""
    dumps = base / "dumps"
    dumps.mkdir()
    env = {**os.environ, **env, "PROBE_DUMP_PREFIX": str(dumps / "comm_lib_trace_rank_"),
           "OMP_NUM_THREADS": "1", "DDPTOP_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    # Every rank of these probes ends by itself once its dump is written (atomically), and the
    # rank that dies undumped waits for the others' dumps first: torchrun's monitor need not be
    # slow (at 10 s a run waited up to 10 s for torchrun to see its ranks gone).
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(nproc), "--monitor-interval", "1",
           str(PROBES / probe)]
    with open(base / "torchrun.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            scenario = env.get("PROBE_SCENARIO")
            pytest.fail(f"the {probe} job ({scenario}) did not end within {RUN_TIMEOUT_S:g} s")
        finally:
            stop_tree(proc)
    return dumps


def fr_dump_set(tmp_factory: pytest.TempPathFactory, scenario: str, fmt: str = "pickle") -> Path:
    """The folder of *fmt* dumps of one run of *scenario* (cached for the session: one run
    writes both formats at the same moment, each rank's pickle and JSON dump)."""
    key = (scenario, fmt)
    if key in _made:
        return _made[key]
    base = tmp_factory.mktemp(f"fr-{scenario}")
    json_dumps = base / "dumps-json"
    json_dumps.mkdir()
    dumps = run_dump_probe(base, "fr_dumps.py", 4, {
        "PROBE_SCENARIO": scenario, "PROBE_DUMP_FORMAT": "both",
        "PROBE_DUMP_PREFIX_JSON": str(json_dumps / "comm_lib_trace_rank_")})
    expected = {0, 2, 3} if scenario == "killed" else {0, 1, 2, 3}
    got = {int(p.name.rsplit("_", 1)[1]) for p in dumps.iterdir() if p.name.rsplit("_", 1)[1].isdigit()}
    log_tail = (base / "torchrun.log").read_text()[-2000:]
    assert got == expected, f"{scenario}: dumps of ranks {sorted(got)}; log: {log_tail}"
    _made[(scenario, "pickle")], _made[(scenario, "json")] = dumps, json_dumps
    return _made[key]
