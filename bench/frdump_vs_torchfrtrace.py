"""ddptop doctor, PyTorch's torchfrtrace and NVIDIA's FR attribution, side by side, on Flight Recorder dumps.

Sets, each with its known culprits and healthy ranks:

* real: each scenario of ``probes/fr_dumps.py`` (a real 4-rank gloo job under torchrun, dumps written by
  torch's own serialiser) with its planted culprit;
* moe: the generated MoE dump sets in ``tests/data/fr_moe/<scenario>/`` (truth in ``truth.json`` there);
* log: the real logs in ``tests/data/logs/*.log`` (truth in ``truth.json`` there), read by ddptop only;
* generated: 1024 ranks x 2000 entries in the shape torch writes (every entry with its own frames),
  rank 517 stopped one collective short, pickled and as JSON (not with ``--quick``).

The first table has, per set and tool (ddptop, torchfrtrace, nvrx = ``nvidia-resiliency-ext``'s
``fr_attribution``): the culprits it named, healthy ranks it named, lines of output, seconds (and ddptop's
peak RSS). The second: true and false positives per set and tool, recall and precision per tool. How each
tool's answer is read, and how NVIDIA's package is installed (its own venv under
``~/.cache/ddptop-bench/nvrx``, never the project's .venv): ``bench/frtools.py``; the scoring:
``bench/frsets.py``.

Run: ``.venv/bin/python bench/frdump_vs_torchfrtrace.py [--quick] [--ranks 1024 --entries 2000]
[--nvrx-src DIR] [--sets DIR ...]``. ``--quick`` skips the generated sets and reuses the real sets an
earlier run kept in ``~/.cache/ddptop-bench/real`` for the same probe and torch (about a minute then);
``--nvrx-src`` runs NVIDIA's attribution from a source checkout of nvidia-resiliency-ext where the wheel
pip finds has none (it ships from 0.5.0); a DIR of your own dumps is run by the three tools (with no known
culprit, "named" is listed).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from frsets import Case, log_cases, moe_cases, pr_table, ranks_text
from frtools import PREFIX, Nvrx, Run, dump_ranks, prepare_nvrx, run_ddptop, run_nvrx, run_torchfrtrace

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SCENARIOS = {"skip": {1}, "op": {2}, "killed": {1}, "subgroup": {1}}
REAL_WORLD = 4
FR_TOOLS = ["ddptop", "torchfrtrace", "nvrx"]
REAL_CACHE = Path(os.environ.get("BENCH_REAL_CACHE", Path.home() / ".cache" / "ddptop-bench" / "real"))


def make_real(scenario: str, folder: Path) -> None:
    """One run of the probe; its dumps land in *folder*."""
    env = {
        **os.environ,
        "PROBE_SCENARIO": scenario,
        "PROBE_DUMP_PREFIX": str(folder / PREFIX),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "4",
        "--monitor-interval",
        "10",
        str(ROOT / "probes" / "fr_dumps.py"),
    ]
    subprocess.run(cmd, env=env, capture_output=True, timeout=180, check=False, start_new_session=True)


def make_generated(folder: Path, ranks: int, entries: int, culprit: int, template: dict[str, object],
                   fmt: str = "pickle") -> None:
    """*ranks* dumps of *entries* entries each, derived from a real dump's entry: a pickle (protocol 2,
    every entry with its frames) or JSON as torch's JSON writer has it (no frames, 0 for no time)."""
    base = template["entries"][-1]  # type: ignore[index]
    for rank in range(ranks):
        count = entries - 1 if rank == culprit else entries
        rows = []
        for i in range(count):
            e = copy.deepcopy(base)
            e.update(
                record_id=i,
                collective_seq_id=i + 1,
                time_created_ns=1_795_000_000_000_000_000 + i * 10**6,
                retired=i + 1 < entries,
                frames=[dict(f, line=f["line"] + i % 97) for f in base["frames"]],
            )
            rows.append(e)
        dump = {
            "version": "2.10",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))}},
            "pg_status": {
                "0": {
                    "last_enqueued_collective": count,
                    "last_started_collective": -1,
                    "last_completed_collective": min(count, entries - 1),
                }
            },
            "comm_lib_version": "",
            "entries": rows,
        }
        if fmt == "json":
            for row in rows:
                row.pop("frames", None)
                for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                    row[key] = row.get(key) or 0
            (folder / f"{PREFIX}{rank}").write_text(json.dumps(dump))
        else:
            (folder / f"{PREFIX}{rank}").write_bytes(pickle.dumps(dump, protocol=2))


def row(name: str, tool: str, run: Run, culprit: set[int] | None, healthy: set[int] | None = None) -> str:
    if run.named is None:
        found, named_healthy = "-", "-"
    elif culprit is None:
        found, named_healthy = f"named {ranks_text(run.named)}", "?"
    else:
        found = f"{len(culprit & run.named)}/{len(culprit)}"
        named_healthy = str(len(run.named & healthy) if healthy is not None else len(run.named - culprit))
    rss = f"{run.rss_mb:.0f}" if run.rss_mb is not None else "-"
    return (f"| {name} | {tool} | {found} | {named_healthy} | {run.lines} | {run.seconds:.2f} | {rss} | "
            f"{run.note} |")


def fr_runs(folder: Path, nv: Nvrx) -> list[tuple[str, Run]]:
    """The three tools on one folder of dumps, one after the other (their seconds are not shared)."""
    return [("ddptop", run_ddptop(folder)), ("torchfrtrace", run_torchfrtrace(folder)),
            ("nvrx", run_nvrx(nv, folder))]


def complete(case: Case) -> bool:
    """Every healthy rank of a real set dumped (its culprit may not have)."""
    return case.target.is_dir() and (case.healthy or set()) <= dump_ranks(case.target)[1]


def make_real_sets(tmp: Path, reuse: bool) -> list[Case]:
    """The probe's scenarios, two jobs at a time (the machine this was written on has two cores). With
    *reuse*, sets this bench made before with the same probe and torch are taken from REAL_CACHE."""
    probe = (ROOT / "probes" / "fr_dumps.py").read_bytes()
    torch = importlib.metadata.version("torch")
    cache = REAL_CACHE / f"torch-{torch}-{hashlib.sha256(probe).hexdigest()[:12]}"
    cases = []
    for scenario, culprit in SCENARIOS.items():
        healthy = set(range(REAL_WORLD)) - culprit
        name = f"{scenario} (real, {REAL_WORLD} ranks)"
        cases.append(Case(name, "real", cache / scenario, culprit, healthy, REAL_WORLD))
    if reuse and all(map(complete, cases)):
        print(f"<!-- {len(cases)} real sets reused from {cache} -->", flush=True)
        return cases
    for case in cases:
        case.target = tmp / case.target.name
        case.target.mkdir()
    began = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda c: make_real(c.target.name, c.target), cases))
    print(f"<!-- {len(cases)} real sets made in {time.monotonic() - began:.0f} s -->", flush=True)
    if all(map(complete, cases)):
        shutil.rmtree(cache, ignore_errors=True)
        for case in cases:  # every healthy rank dumped: worth keeping for --quick
            shutil.copytree(case.target, cache / case.target.name)
    return cases


def versions(nv: Nvrx) -> str:
    torch = importlib.metadata.version("torch")
    nvrx = nv.label or f"n/a: {nv.why}"
    return f"<!-- torch {torch} (torchfrtrace), {nvrx} (nvrx, python {sys.version.split()[0]}) -->"


def generated(tmp: Path, fmt: str, ranks: int, entries: int, template: dict[str, object],
              nv: Nvrx) -> tuple[Case, list[tuple[str, Run]]]:
    """Make the big set in *fmt*, run the tools on it, remove it."""
    folder = tmp / f"generated-{fmt}"
    folder.mkdir()
    culprit = ranks // 2 + 5
    began = time.monotonic()
    make_generated(folder, ranks, entries, culprit, template, fmt)
    size = sum(p.stat().st_size for p in folder.iterdir()) >> 20
    print(f"<!-- generated {ranks} x {entries} {fmt} ({size} MiB) in {time.monotonic() - began:.0f} s -->")
    name = f"generated {ranks} x {entries}, {fmt}, {size} MiB"
    case = Case(name, "generated", folder, {culprit}, set(range(ranks)) - {culprit}, ranks)
    runs = fr_runs(folder, nv)
    shutil.rmtree(folder)
    return case, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="skip the generated sets, reuse real sets made before (same probe and torch)")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--sets", nargs="*", default=[], help="folders of real dumps of your own")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--formats", default="pickle,json", help="formats of the generated set")
    parser.add_argument("--moe", type=Path, default=ROOT / "tests" / "data" / "fr_moe")
    parser.add_argument("--logs", type=Path, default=ROOT / "tests" / "data" / "logs")
    parser.add_argument("--nvrx-sets", type=Path, default=ROOT / "tests" / "data" / "nvrx_fr")
    parser.add_argument("--nvrx-src", type=Path, help="a source checkout of nvidia-resiliency-ext to run")
    args = parser.parse_args()
    nv = prepare_nvrx(args.nvrx_src)
    print(versions(nv))
    print("| set | tool | culprits found | healthy ranks named | lines | seconds | peak RSS MB | note |")
    print("|---|---|---|---|---|---|---|---|")
    results: list[tuple[Case, str, Run]] = []
    notes: list[str] = []

    def report(case: Case, runs: list[tuple[str, Run]]) -> None:
        for tool, run in runs:
            results.append((case, tool, run))
            print(row(case.name, tool, run, case.culprits, case.healthy), flush=True)

    with tempfile.TemporaryDirectory(prefix="frbench-") as tmp:
        template: dict[str, object] | None = None
        for case in [] if args.skip_real else make_real_sets(Path(tmp), args.quick):
            if template is None and (case.target / f"{PREFIX}0").exists():
                template = pickle.loads((case.target / f"{PREFIX}0").read_bytes())
            report(case, fr_runs(case.target, nv))
        for path in args.sets:
            report(Case(Path(path).name, "own", Path(path), None, None), fr_runs(Path(path), nv))
        moe, why = moe_cases(args.moe)
        notes += why
        nvrx_sets, why = moe_cases(args.nvrx_sets, family="nvrx")
        notes += why
        for case in [*moe, *nvrx_sets]:
            report(case, fr_runs(case.target, nv))
        logs, why = log_cases(args.logs)
        notes += why
        began = time.monotonic()
        with ThreadPoolExecutor(2) as pool:  # ddptop only; its seconds here are not compared
            runs = list(pool.map(lambda c: run_ddptop(c.target, plain=False), logs))
        results += [(case, "ddptop", run) for case, run in zip(logs, runs, strict=True)]
        print(f"<!-- {len(logs)} log(s) run by ddptop only in {time.monotonic() - began:.0f} s: "
              "scored in the next table -->", flush=True)
        for fmt in args.formats.split(",") if template is not None and args.ranks and not args.quick else []:
            report(*generated(Path(tmp), fmt, args.ranks, args.entries, template, nv))
    for note in notes:
        print(f"<!-- {note} -->")
    print()
    print("\n".join(pr_table(results, FR_TOOLS)))


if __name__ == "__main__":
    main()
