"""Mutation testing of the diagnosis rules (mutmut 3.8.1), on a budget.

Each mutant is one small change to one function of ``ddptop/diagnosis/`` (a flipped
comparison, a changed constant, a dropped call, ...); the fast pure-function tests that
cover the rules run against it. A mutant the tests do not fail ("survived") is a change
to a rule that no test would notice: either an equivalent change or a gap in what the
tests assert (the kind of test that cannot fail, issue #21).

mutmut never touches this checkout: the script copies ``ddptop/``, ``tests/`` and
``pyproject.toml`` into a work directory (default ``.mutation/``, ignored by git), writes
mutmut's config there (``setup.cfg``) and runs mutmut in it; mutmut writes its mutated
copy under ``WORKDIR/mutants/``. Every run starts fresh (no stale verdicts).

Two budgets. ``--sample K`` tests one mutant in K, chosen by a hash of its name (so the
same ones every run while the source is unchanged: before/after numbers compare); mutmut
first generates every mutant and records which tests reach which function, then is
stopped and rerun on the sample by name. ``--budget-s`` is wall-clock for the whole run:
when it runs out mutmut is interrupted (as by Ctrl-C) and the mutants it did not reach
are counted as "untested"; it tries the mutants with the fastest tests first. One worker
by default (a shared 2-core machine). All of ddptop/diagnosis is about 3500 mutants and
an hour on one core; ``make mutation`` samples one in 6.

Prints a table per module: mutants (in the sample), killed, survived, timeout, no tests
(no selected test reaches the function: a survivor too), other (suspicious, segfault),
untested, and the score: killed + timeout over the mutants tested. Survivors are listed
by name with ``--survivors``, with their diffs in ``WORKDIR/survivors.txt``.

    .venv/bin/pip install -e ".[mutation]"
    .venv/bin/python bench/mutation.py --sample 6 --budget-s 900   # what `make mutation` runs
    .venv/bin/python bench/mutation.py --budget-s 300 --module rules_progress --survivors
    make mutation
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PACKAGE = "ddptop/diagnosis"

# Fast, pure tests over hand-built snapshots and recorded dumps: no torchrun job, no
# sockets. (Tests that start `ddptop doctor` as a subprocess run the unmutated checkout,
# so they neither kill nor hide a mutant.)
TESTS = [
    "tests/test_diagnosis_rules.py",
    "tests/test_last_words_rules.py",
    "tests/test_diagnosis_lateness.py",
    "tests/test_diagnosis_wavefront.py",
    "tests/test_tui_rows.py",
    "tests/test_trainer_numbers.py::test_unequal_eval_loader_is_its_own_warning",
    "tests/test_trainer_numbers.py::test_unequal_batches_waits_for_ranks_that_know_their_training_loader",
    "tests/test_trainer_numbers.py::test_rank_detail_lists_every_loader",
    "tests/test_trainer_numbers.py::test_unequal_eval_loaders_named_after_the_job_died",
]

# mutmut 3.8.1's exit codes (mutmut/stats.py), folded into the table's columns.
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, -24, 24, 152, 255}
NO_TESTS = {5, 33}
INTERRUPTED = 2  # the mutant whose tests the budget's Ctrl-C stopped


def column(code: int | None) -> str:
    if code is None or code == INTERRUPTED:
        return "untested"
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    if code in TIMEOUT:
        return "timeout"
    if code in NO_TESTS:
        return "no tests"
    return "other"


def prepare(work: Path, modules: list[str], tests_at: str | None) -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "ddptop", work / "ddptop", ignore=ignore)
    if tests_at:  # tests/ as of a git revision: the "before" of a before/after comparison
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", tests_at, "tests"], check=True,
                             capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=tar, check=True)
    else:
        shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")
    only = [f"{PACKAGE}/{m}.py" for m in modules] if modules else [f"{PACKAGE}/*.py"]
    lines = [
        "[mutmut]",
        "source_paths = ddptop",
        "only_mutate =",
        *(f"    {p}" for p in only),
        "pytest_add_cli_args_test_selection =",
        *(f"    {t}" for t in TESTS),
        # No cache provider (nothing written beside the tests), no xdist inside a mutant.
        "pytest_add_cli_args =",
        "    -p",
        "    no:cacheprovider",
        "    -p",
        "    no:xdist",
        # The checkout is not a git work tree here: nothing to compare against.
        "use_git_change_detection = false",
        "",
    ]
    (work / "setup.cfg").write_text("\n".join(lines))


def run_mutmut(work: Path, names: list[str], deadline: float, workers: int, log: Path,
               until: str | None = None) -> int | None:
    """`mutmut run [NAMES]` in WORK; interrupted with SIGINT (as Ctrl-C) at *deadline* or,
    with *until*, as soon as that line shows in its output. None when interrupted."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")  # for `until`
    env.pop("DDPTOP_TOKEN", None)
    with log.open("a") as out:
        proc = subprocess.Popen([str(BIN / "mutmut"), "run", "--max-children", str(workers), *names],
                                cwd=work, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    while proc.poll() is None:
        if time.monotonic() >= deadline or (until and until in log.read_text(errors="replace")):
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None
        time.sleep(0.5)
    return proc.returncode


def sampled(name: str, k: int) -> bool:
    return zlib.crc32(name.encode()) % k == 0


def results(work: Path) -> dict[str, dict[str, int | None]]:
    """{module: {mutant name: exit code or None}} from mutmut's .meta files."""
    out: dict[str, dict[str, int | None]] = {}
    for meta in sorted((work / "mutants" / PACKAGE).glob("*.py.meta")):
        data = json.loads(meta.read_text())
        out[meta.name.removesuffix(".py.meta")] = data.get("exit_code_by_key", {})
    return out


def table(found: dict[str, dict[str, int | None]]) -> list[str]:
    cols = ["mutants", "killed", "survived", "timeout", "no tests", "other", "untested"]
    rows = [f"{'module':<20}" + "".join(f"{c:>9}" for c in cols) + f"{'score':>8}"]
    total: Counter[str] = Counter()
    for module, codes in found.items():
        counts = Counter(column(c) for c in codes.values())
        counts["mutants"] = len(codes)
        total.update(counts)
        rows.append(line(module, counts, cols))
    rows.append(line("total", total, cols))
    return rows


def line(name: str, counts: Counter[str], cols: list[str]) -> str:
    tested = counts["mutants"] - counts["untested"]
    caught = counts["killed"] + counts["timeout"]
    score = f"{100 * caught / tested:.1f}%" if tested else "-"
    return f"{name:<20}" + "".join(f"{counts[c]:>9}" for c in cols) + f"{score:>8}"


def failed(rc: int | None, log: Path) -> int:
    print(f"mutation: mutmut exited with {rc}; the end of {log}:", file=sys.stderr)
    print("\n".join(log.read_text(errors="replace").splitlines()[-30:]), file=sys.stderr)
    return 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=900.0, help="wall-clock budget (default 900 s)")
    ap.add_argument("--sample", type=int, default=1, metavar="K",
                    help="test one mutant in K, the same ones every run (default 1: all)")
    ap.add_argument("--workers", type=int, default=1, help="mutmut's --max-children (default 1)")
    ap.add_argument("--module", action="append", default=[],
                    help="a module of ddptop/diagnosis to mutate, e.g. rules_progress (repeatable; "
                         "default all)")
    ap.add_argument("--workdir", type=Path, default=ROOT / ".mutation",
                    help="scratch directory (default .mutation/)")
    ap.add_argument("--survivors", action="store_true",
                    help="list surviving mutants (diffs in WORKDIR/survivors.txt)")
    ap.add_argument("--tests-at", metavar="REV",
                    help="run tests/ as of this git revision (default: the working tree's)")
    args = ap.parse_args()
    if not (BIN / "mutmut").exists():
        print(f"mutation: no mutmut beside {sys.executable}: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    work = args.workdir.resolve()
    if work == ROOT or ROOT.is_relative_to(work):
        print(f"mutation: refusing to use {work} as the scratch directory", file=sys.stderr)
        return 2
    prepare(work, args.module, args.tests_at)
    log = work / "mutmut.log"
    print(f"mutation: mutmut on {PACKAGE} ({', '.join(args.module) or 'all modules'}), tests/ at "
          f"{args.tests_at or 'the working tree'}, one mutant in "
          f"{args.sample}, {args.workers} worker(s), budget {args.budget_s:.0f} s, log {log}", flush=True)
    start = time.monotonic()
    deadline = start + args.budget_s
    names: list[str] = []
    if args.sample > 1:
        # Generate every mutant and collect which tests reach which function, then stop.
        rc = run_mutmut(work, [], deadline, args.workers, log, until="Running mutation testing")
        generated = results(work)
        names = sorted(n for codes in generated.values() for n in codes if sampled(n, args.sample))
        if rc not in (0, None) or not names:
            return failed(rc, log)
    rc = run_mutmut(work, names, deadline, args.workers, log)
    found = results(work)
    if names:
        keep = set(names)
        found = {m: {n: c for n, c in codes.items() if n in keep} for m, codes in found.items()}
    found = {m: codes for m, codes in found.items() if codes}
    if not found or rc not in (0, None):
        return failed(rc, log)
    state = "budget ran out, mutmut interrupted" if rc is None else "every mutant tried"
    print(f"mutation: {time.monotonic() - start:.0f} s ({state})")
    print("\n".join(table(found)))
    if args.survivors:
        names = sorted(n for codes in found.values() for n, c in codes.items() if column(c) == "survived")
        diffs = []
        for name in names:
            shown = subprocess.run([str(BIN / "mutmut"), "show", name], cwd=work, capture_output=True,
                                   text=True)
            diffs.append(shown.stdout)
        (work / "survivors.txt").write_text("\n".join(diffs))
        print(f"\nsurvivors ({len(names)}; diffs in {work / 'survivors.txt'}):")
        print("\n".join(f"  {n}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
