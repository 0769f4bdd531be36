"""Write docs/examples.md: one real finding of each kind, with the culprit's frame where there is one.

Each case runs a probe of ``probes/`` under ``ddptop launch -- torchrun`` (gloo on this
machine's CPUs, in a private runtime directory, its own session, always stopped), polls
``ddptop doctor --json JOB`` until a finding of the wanted kind comes (bounded; once the job
has ended, doctor reads its record), and writes that finding as doctor printed it: title,
evidence (with "rank R is at file:line in function" where the culprit's place is known),
remedy. Nothing in the output is written by hand.

Run from the repository root: ``.venv/bin/python docs/examples.py`` (about ten minutes on a
2-core machine); ``--only KIND`` runs one case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddptop.proctree import stop_tree

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
OUT = ROOT / "docs" / "examples.md"


@dataclass
class Case:
    """One probe run and the finding it should show."""

    kind: str
    what: str  # the failure, in a few words
    probe: str
    nproc: int
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 150.0


CASES = [
    Case("unequal_batches", "the unseeded split of catalog F5, from the first batch", "unseeded_split", 4,
         {"PROBE_SECONDS": "45", "PROBE_PG_TIMEOUT": "40", "PROBE_STEP_SLEEP": "0.1"}),
    Case("collective_mismatch", "F5 at the checkpoint save: the short rank's all_gather", "unseeded_split", 4,
         {"PROBE_SECONDS": "45", "PROBE_PG_TIMEOUT": "40", "PROBE_STEP_SLEEP": "0.1"}),
    Case("collective_stall", "a rank lingering in a forward hook of a real FSDP2 job", "fw_fsdp2", 4,
         {"PROBE_LINGER_RANK": "2", "PROBE_LINGER_AT_STEP": "3", "PROBE_SECONDS": "120", "PROBE_TRAIN": "5",
          "PROBE_EPOCHS": "2"}),
    Case("straggler", "one rank persistently slower", "straggler", 3, {"PROBE_SECONDS": "45"}),
    Case("input_bound", "a rank starved by its DataLoader", "dataloader_contention", 2,
         {"PROBE_SECONDS": "45", "PROBE_WORKERS": "2"}),
    Case("cpu_oversubscribed", "more DataLoader workers than cores", "dataloader_contention", 2,
         {"PROBE_SECONDS": "45", "PROBE_WORKERS": "2"}),
    Case("param_mismatch", "a rank built another model (catalog F1)", "param_mismatch", 3,
         {"PROBE_SECONDS": "40", "PROBE_PG_TIMEOUT": "30", "PROBE_LINGER": "8"}),
    Case("rank_lost", "SIGSEGV in native code on one rank (catalog F4)", "segfault_rank", 3,
         {"PROBE_SECONDS": "40", "PROBE_PG_TIMEOUT": "30", "PROBE_CRASH_AFTER_STEPS": "30"}),
    Case("rank_unresponsive", "a rank asleep in C holding the GIL, read from outside", "rank_dies", 2,
         {"PROBE_DEATH": "wedge_gil", "PROBE_DIE_RANK": "1", "PROBE_DIE_AT_STEP": "10",
          "PROBE_WEDGE_S": "40"}),
    Case("unequal_eval_batches", "one rank has a validation batch more", "unequal_eval", 4, {}),
    Case("rng_divergence", "NumPy left unseeded on a healthy job (info)", "healthy", 2,
         {"PROBE_SECONDS": "25"}),
]

# Not producible on one machine: said so in the output, with the test that shows them.
ELSEWHERE = {
    "gpu_heterogeneous": "needs ranks on different GPU models (tests/test_diagnosis_rules.py)",
    "version_mismatch": "needs ranks with different torch/CUDA/driver versions "
                        "(tests/test_diagnosis_rules.py)",
    "shm_pressure": "needs a container with a small /dev/shm (tests/test_memory_e2e.py)",
    "node_lost": "needs several hosts: network namespaces as root (tests/test_three_hosts.py)",
    "host_unreachable": "needs several hosts and a cut cable: network namespaces as root "
                        "(tests/test_three_hosts.py)",
}


def doctor(job_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """The findings of one ``ddptop doctor --json JOB`` (none when it failed)."""
    res = subprocess.run([str(BIN / "ddptop"), "doctor", "--json", "--watch", "3", job_id], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    try:
        return list(json.loads(res.stdout)["findings"])
    except (ValueError, KeyError):
        return []


def run_case(case: Case, tmp: Path) -> dict[str, Any] | None:
    """Start the probe, poll doctor until a finding of *case.kind* comes; that finding."""
    runtime = tmp / f"rt-{case.kind}"
    runtime.mkdir(mode=0o700)
    job_id = f"ex-{case.kind.replace('_', '-')}"
    env = dict(os.environ, DDPTOP_RUNTIME_DIR=str(runtime), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PROBE_RELEASE=str(tmp / f"release-{case.kind}"), **case.env)
    cmd = [str(BIN / "ddptop"), "launch", "--job-id", job_id, "--interval", "0.5", "--",
           str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(case.nproc),
           str(ROOT / "probes" / f"{case.probe}.py")]
    with open(tmp / f"{case.kind}.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + case.timeout_s
    try:
        while time.monotonic() < deadline:
            ended = proc.poll() is not None
            found = [f for f in doctor(job_id, env) if f["kind"] == case.kind]
            if found:
                return found[0]
            if ended:
                return None  # the record was read: it will not come
            time.sleep(1.0)
        return None
    finally:
        stop_tree(proc)  # its process group and every rank (ranks run in sessions of their own)


def as_text(case: Case, finding: dict[str, Any] | None) -> str:
    head = f"### `{case.kind}`: {case.what}\n\n`probes/{case.probe}.py`, {case.nproc} ranks, gloo.\n\n"
    if finding is None:
        return head + "(no such finding came within the time: rerun `docs/examples.py --only " \
                      f"{case.kind}` and look at its log)\n"
    lines = [f"{finding['severity']}  {finding['kind']}  ranks {finding['ranks']}"
             + ("  (cannot tell which)" if not finding.get("certain", True) else ""),
             f"  {finding['title']}"]
    lines += [f"    {line}" for line in finding.get("evidence", [])]
    if finding.get("victims"):
        lines.append(f"    victims: {finding['victims']}")
    if finding.get("remedy"):
        lines.append(f"  fix: {finding['remedy']}")
    return head + "\n".join("    " + ln for ln in lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the case of this kind only (prints, writes nothing)")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only in (None, c.kind)]
    parts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ddptop-examples-") as tmp:
        for case in cases:
            started = time.monotonic()
            finding = run_case(case, Path(tmp))
            print(f"{case.kind}: {'found' if finding else 'NOT FOUND'} in {time.monotonic() - started:.0f} s",
                  flush=True)
            parts.append(as_text(case, finding))
    if args.only:
        print("\n".join(parts))
        return 0
    missing = "".join(f"- `{kind}`: {why}\n" for kind, why in ELSEWHERE.items())
    OUT.write_text(
        "# One real finding of each kind\n\n"
        "Written by `docs/examples.py` from real runs of the probes on a 2-core CPU machine (gloo),\n"
        "as `ddptop doctor --json` printed them; rerun it after a change to a rule. Where the\n"
        "culprit's place in the code is known, the evidence says \"rank R is at file:line in function\"\n"
        "([diagnosis.md](diagnosis.md#where-the-culprit-is)).\n\n"
        + "\n".join(parts)
        + "\n## Kinds this script cannot produce on one machine\n\n" + missing)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
