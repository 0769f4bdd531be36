"""ddptop doctor and PyTorch's torchfrtrace, side by side, on Flight Recorder dump sets.

Real sets first: each scenario of ``probes/fr_dumps.py`` (a real 4-rank gloo job under
torchrun, dumps written by torch's own serialiser) with its planted culprit. Then a
generated set of 1024 ranks x 2000 entries in the shape torch writes (every entry with its
own frames), rank 517 stopped one collective short. For each tool: the culprit ranks it
named, healthy ranks it named, lines of output, seconds (and ddptop's peak RSS).

Run: ``python bench/frdump_vs_torchfrtrace.py [--ranks 1024 --entries 2000] [--sets DIR ...]``
(a DIR of your own dumps is run by both tools; with no known culprit, "named" is listed).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SCENARIOS = {"skip": {1}, "op": {2}, "killed": {1}, "subgroup": {1}}
PREFIX = "comm_lib_trace_rank_"
FRTRACE_TIMEOUT_S = float(os.environ.get("BENCH_FRTRACE_TIMEOUT", "600"))


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


# ddptop's own peak RSS, and its reading processes' (a large set is read on several):
# RUSAGE_CHILDREN of the bench would include the probes' torch ranks.
MEASURED = """
import resource, runpy, sys
sys.argv = ["ddptop", *sys.argv[1:]]
code = 0
try:
    runpy.run_module("ddptop", run_name="__main__")
except SystemExit as exc:
    code = exc.code
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
sys.stderr.write(f"\\nMAXRSS_KB {own} {kids}\\n")
sys.exit(code)
"""


def run_ddptop(folder: Path) -> dict[str, object]:
    began = time.monotonic()
    res = subprocess.run([sys.executable, "-c", MEASURED, "doctor", "--json", str(folder)],
                         capture_output=True, text=True, timeout=600, check=False)
    seconds = time.monotonic() - began
    found = re.search(r"MAXRSS_KB (\d+) (\d+)", res.stderr)
    rss_mb = max(int(found.group(1)), int(found.group(2))) / 1024 if found else 0.0
    plain = subprocess.run([sys.executable, "-m", "ddptop", "doctor", str(folder)], capture_output=True,
                           text=True, timeout=600, check=False, env={**os.environ, "COLUMNS": "120"})
    try:
        findings = json.loads(res.stdout)["findings"]
    except (ValueError, KeyError):
        return {"named": None, "lines": 0, "seconds": seconds, "note": res.stderr.strip()[-120:]}
    named = {r for f in findings if f["severity"] != "info" for r in f["ranks"]}
    return {"named": named, "lines": len(plain.stdout.splitlines()), "seconds": seconds, "rss_mb": rss_mb,
            "note": ""}


def run_torchfrtrace(folder: Path, world: int) -> dict[str, object]:
    exe = shutil.which("torchfrtrace", path=str(BIN))
    if exe is None:
        return {"named": None, "lines": 0, "seconds": 0.0, "note": "torchfrtrace not installed"}
    began = time.monotonic()
    try:
        res = subprocess.run(
            [exe, str(folder), "-p", PREFIX, "--allow-incomplete-ranks"],
            capture_output=True,
            text=True,
            timeout=FRTRACE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"named": None, "lines": 0, "seconds": FRTRACE_TIMEOUT_S,
                "note": f"timed out after {FRTRACE_TIMEOUT_S:g} s"}
    seconds = time.monotonic() - began
    out = res.stdout + res.stderr
    if res.returncode != 0:
        last = [ln for ln in out.splitlines() if ln.strip()][-1:] or ["?"]
        return {
            "named": None,
            "lines": len(out.splitlines()),
            "seconds": seconds,
            "note": f"failed: {last[0][:80]}",
        }
    named = {int(n) for n in re.findall(r"\b[Rr]anks?\D{0,3}(\d{1,5})\b", out) if int(n) < world}
    return {"named": named, "lines": len(out.splitlines()), "seconds": seconds, "note": ""}


def row(name: str, tool: str, result: dict[str, object], culprit: set[int] | None) -> str:
    named = result["named"]
    if named is None:
        found, healthy = "-", "-"
    elif culprit is None:
        found, healthy = f"named {sorted(named)[:8]}", "?"  # type: ignore[call-overload]
    else:
        found = f"{len(culprit & named)}/{len(culprit)}"  # type: ignore[operator]
        healthy = str(len(named - culprit))  # type: ignore[operator]
    rss = f"{result['rss_mb']:.0f}" if "rss_mb" in result else "-"
    return (
        f"| {name} | {tool} | {found} | {healthy} | {result['lines']} | {result['seconds']:.2f} | {rss} | "
        f"{result['note']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--sets", nargs="*", default=[], help="folders of real dumps of your own")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--formats", default="pickle,json", help="formats of the generated set")
    args = parser.parse_args()
    print("| set | tool | culprits found | healthy ranks named | lines | seconds | peak RSS MB | note |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="frbench-") as tmp:
        template: dict[str, object] | None = None
        for scenario, culprit in [] if args.skip_real else SCENARIOS.items():
            folder = Path(tmp) / scenario
            folder.mkdir()
            make_real(scenario, folder)
            if template is None and (folder / f"{PREFIX}0").exists():
                template = pickle.loads((folder / f"{PREFIX}0").read_bytes())
            for tool, result in (
                ("ddptop", run_ddptop(folder)),
                ("torchfrtrace", run_torchfrtrace(folder, 4)),
            ):
                print(row(f"{scenario} (real, 4 ranks)", tool, result, culprit), flush=True)
        for path in args.sets:
            folder = Path(path)
            for tool, result in (
                ("ddptop", run_ddptop(folder)),
                ("torchfrtrace", run_torchfrtrace(folder, 1 << 16)),
            ):
                print(row(folder.name, tool, result, None), flush=True)
        for fmt in args.formats.split(",") if template is not None and args.ranks else []:
            folder = Path(tmp) / f"generated-{fmt}"
            folder.mkdir()
            culprit = args.ranks // 2 + 5
            began = time.monotonic()
            make_generated(folder, args.ranks, args.entries, culprit, template, fmt)
            size = sum(p.stat().st_size for p in folder.iterdir()) >> 20
            took = time.monotonic() - began
            print(f"<!-- generated {args.ranks} x {args.entries} {fmt} ({size} MiB) in {took:.0f} s -->")
            name = f"generated {args.ranks} x {args.entries}, {fmt}, {size} MiB"
            print(row(name, "ddptop", run_ddptop(folder), {culprit}), flush=True)
            print(row(name, "torchfrtrace", run_torchfrtrace(folder, args.ranks), {culprit}), flush=True)
            shutil.rmtree(folder)


if __name__ == "__main__":
    main()
