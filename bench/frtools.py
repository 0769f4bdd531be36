"""The three tools that ``bench/frdump_vs_torchfrtrace.py`` compares, each run as a subprocess on one set.

* ``ddptop doctor --json`` (folders of dumps, or a log file): the ranks it names are the ``ranks`` of its
  findings of severity warning or critical, less the ranks a finding lists as its ``victims``;
* PyTorch's ``torchfrtrace`` (from the project's .venv): the ranks of its ``missing ranks: {..}`` and
  ``Culprit rank N`` lines (``torch/distributed/flight_recorder/components/types.py``); its
  "cannot decide ... missed FR dumps from ranks" names no culprit and is not counted;
* NVIDIA's Flight Recorder attribution, ``nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution``
  of ``nvidia-resiliency-ext`` (0.5.0 on), run as its CLI with ``--emit-stdout``: the ranks of the
  "Missing Ranks" column of the table it prints, parsed as its own ``_extract_missing_ranks_from_table``
  does (that list is what it reports as "hanging ranks" without an LLM).

NVIDIA's package lives in its own venv, ``~/.cache/ddptop-bench/nvrx`` (``BENCH_NVRX_VENV``), made once
without system site-packages, with ``pip install --no-deps nvidia-resiliency-ext`` (``BENCH_NVRX_REQ``):
its FR attribution imports nothing but the standard library (langchain only for ``--llm-analyze``), so
no dependency, and no torch, goes in. Delete that folder to reinstall. A source checkout of the package
(``--nvrx-src DIR``: the repository or its ``src/``) is put first on that venv's PYTHONPATH instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
PREFIX = "comm_lib_trace_rank_"
TIMEOUT_S = float(os.environ.get("BENCH_FRTRACE_TIMEOUT", "600"))
NVRX_VENV = Path(os.environ.get("BENCH_NVRX_VENV", Path.home() / ".cache" / "ddptop-bench" / "nvrx"))
NVRX_REQ = os.environ.get("BENCH_NVRX_REQ", "nvidia-resiliency-ext")
NVRX_MODULE = "nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution"


@dataclass
class Run:
    """What one tool said about one set."""

    named: set[int] | None  # None: it gave no answer (failed, timed out, not installed)
    lines: int = 0
    seconds: float = 0.0
    rss_mb: float | None = None
    note: str = ""
    available: bool = True  # False: the tool could not be run at all here (it is then left out of scores)


def dump_ranks(folder: Path) -> tuple[str, set[int]]:
    """The file-name prefix a set's dumps share before the rank, and the ranks that have a dump."""
    names = [m for p in folder.iterdir() if p.is_file() and (m := re.fullmatch(r"(.*?)(\d+)", p.name))]
    common = Counter(m.group(1) for m in names).most_common(1)
    prefix = common[0][0] if common else PREFIX
    return prefix, {int(m.group(2)) for m in names if m.group(1) == prefix}


def last_line(text: str, drop: str = "") -> str:
    """The last line of *text* that says something, less a leading *drop*, cut to 80 characters."""
    return ([ln.strip() for ln in text.splitlines() if ln.strip()][-1:] or ["?"])[0].removeprefix(drop)[:80]


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


def ddptop_named(findings: list[dict[str, object]]) -> set[int]:
    """Ranks of the findings of warning or worse, less each finding's own ``victims``."""
    named: set[int] = set()
    for f in findings:
        if f.get("severity") in ("warning", "critical"):
            named |= set(f.get("ranks") or []) - set(f.get("victims") or [])  # type: ignore[call-overload]
    return named


def run_ddptop(target: Path, plain: bool = True) -> Run:
    """``ddptop doctor --json TARGET``; with *plain*, also the lines of its text report."""
    began = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-c", MEASURED, "doctor", "--json", str(target)],
                             capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Run(None, seconds=TIMEOUT_S, note=f"timed out after {TIMEOUT_S:g} s")
    seconds = time.monotonic() - began
    found = re.search(r"MAXRSS_KB (\d+) (\d+)", res.stderr)
    rss_mb = max(int(found.group(1)), int(found.group(2))) / 1024 if found else None
    try:
        findings = json.loads(res.stdout)["findings"]
    except (ValueError, KeyError, TypeError):
        said = last_line(re.sub(r"MAXRSS_KB .*", "", res.stderr), drop=f"ddptop: {target}: ")
        return Run(None, seconds=seconds, note=f"failed (exit {res.returncode}): {said}")
    lines = 0
    if plain:
        text = subprocess.run([sys.executable, "-m", "ddptop", "doctor", str(target)], capture_output=True,
                              text=True, timeout=TIMEOUT_S, check=False, env={**os.environ, "COLUMNS": "120"})
        lines = len(text.stdout.splitlines())
    return Run(ddptop_named(findings), lines, seconds, rss_mb)


Done = subprocess.CompletedProcess[str]


def run_tool(cmd: list[str], env: dict[str, str] | None = None) -> tuple[Done | None, float]:
    """*cmd* under the timeout: its result (None if it timed out) and seconds."""
    began = time.monotonic()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=env)
    except subprocess.TimeoutExpired:
        return None, TIMEOUT_S
    return res, time.monotonic() - began


def torchfrtrace_named(out: str) -> set[int]:
    """The ranks torchfrtrace blames: ``missing ranks: {1, 2}`` and ``Culprit rank 3; ...``."""
    missing = re.findall(r"missing ranks: \{([\d, ]*)\}", out)
    return {int(r) for group in missing for r in re.findall(r"\d+", group)} | {
        int(r) for r in re.findall(r"Culprit rank (\d+)", out)}


def run_torchfrtrace(folder: Path) -> Run:
    exe = shutil.which("torchfrtrace", path=str(BIN))
    if exe is None:
        return Run(None, note="n/a (torchfrtrace not installed)", available=False)
    prefix, _ = dump_ranks(folder)
    res, seconds = run_tool([exe, str(folder), "-p", prefix, "--allow-incomplete-ranks"])
    if res is None:
        return Run(None, seconds=seconds, note=f"timed out after {seconds:g} s")
    out = res.stdout + res.stderr
    if res.returncode != 0:
        return Run(None, len(out.splitlines()), seconds, note=f"failed: {last_line(out)}")
    return Run(torchfrtrace_named(out), len(out.splitlines()), seconds)


@dataclass
class Nvrx:
    """NVIDIA's FR attribution as this bench can run it, or why it cannot."""

    python: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    label: str = ""  # which version of the code runs
    why: str = ""  # why it cannot run


PROBE = f"""
import importlib, importlib.metadata as md, json
try:
    dist = md.version("nvidia-resiliency-ext")
except md.PackageNotFoundError:
    dist = None
try:
    where, error = importlib.import_module("{NVRX_MODULE}").__file__, ""
except Exception as exc:
    where, error = None, f"{{type(exc).__name__}}: {{exc}}"
print(json.dumps({{"dist": dist, "module": where, "error": error}}))
"""


def describe(src: Path) -> str:
    """``git describe`` of a checkout, else its folder's name."""
    res = subprocess.run(["git", "-C", str(src), "describe", "--tags", "--always"], capture_output=True,
                         text=True, check=False)
    return res.stdout.strip() if res.returncode == 0 else src.name


def prepare_nvrx(src: Path | None) -> Nvrx:
    """Make (once) the separate venv, install the package without its deps, check the module imports."""
    python = NVRX_VENV / "bin" / "python"
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(NVRX_VENV)], capture_output=True,
                              text=True, check=False)
        if made.returncode != 0:
            return Nvrx(why=f"venv failed: {last_line(made.stderr)}")
    stamp = NVRX_VENV / f".installed-{re.sub(r'[^A-Za-z0-9.=<>-]', '_', NVRX_REQ)}"
    if not stamp.exists():
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", NVRX_REQ],
                             capture_output=True, text=True, check=False, timeout=600)
        if pip.returncode != 0:
            return Nvrx(why=f"pip install --no-deps {NVRX_REQ} failed: {last_line(pip.stderr)}")
        stamp.touch()
    env = {**os.environ, "PYTHONPATH": ""}
    checkout = src
    if src is not None:
        src = (src / "src" if (src / "src" / "nvidia_resiliency_ext").is_dir() else src).resolve()
        env["PYTHONPATH"] = str(src)
    probe = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, env=env, check=False)
    try:
        info = json.loads(probe.stdout)
    except ValueError:
        return Nvrx(why=f"probe failed: {last_line(probe.stderr)}")
    dist = f"nvidia-resiliency-ext {info['dist']}" if info["dist"] else "no nvidia-resiliency-ext"
    if info["module"] is None:
        error = "" if info["error"].startswith("ModuleNotFoundError") else f": {info['error'][:80]}"
        return Nvrx(why=f"{dist} from pip has no attribution.trace_analyzer.fr_attribution{error}; it ships "
                        "from 0.5.0 on: --nvrx-src DIR runs a source checkout")
    if checkout is not None and src is not None and Path(info["module"]).resolve().is_relative_to(src):
        return Nvrx(python, env, f"{describe(checkout)}: nvidia-resiliency-ext source ({dist} wheel unused)")
    return Nvrx(python, env, dist)


def nvrx_named(text: str) -> set[int]:
    """The "Missing Ranks" column of fr_attribution's table, read as its _extract_missing_ranks_from_table."""
    named: set[int] = set()
    capture = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("PGID") and "Missing Ranks" in stripped:
            capture = True
        elif capture and "|" in stripped and len(cols := [c.strip() for c in stripped.split("|")]) >= 6:
            named |= {int(r) for r in cols[-1].split(",") if r.strip().isdigit()}
    return named


def run_nvrx(nv: Nvrx, folder: Path) -> Run:
    if nv.python is None:
        return Run(None, note=f"n/a ({nv.why})", available=False)
    prefix, _ = dump_ranks(folder)
    cmd = [str(nv.python), "-m", NVRX_MODULE, "--fr-path", str(folder), "-p", f"{prefix}*", "--emit-stdout"]
    res, seconds = run_tool(cmd, nv.env)
    if res is None:
        return Run(None, seconds=seconds, note=f"timed out after {seconds:g} s")
    lines = len((res.stdout + res.stderr).splitlines())
    if res.returncode != 0:
        return Run(None, lines, seconds, note=f"failed: {last_line(res.stderr)}")
    return Run(nvrx_named(res.stdout), lines, seconds)
