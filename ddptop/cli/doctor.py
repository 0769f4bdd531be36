"""``ddptop doctor [--json] [--watch SECONDS] [TARGET]``: diagnose a job or a recording.

Prints :func:`ddptop.api.diagnose`: attached to every rank, what arrives is folded into a
job model for up to SECONDS (less once every rank sent two states), then diagnosed. A TARGET
that is a file is read as a recording or bundle instead, and a job that has ended is read
from the black-box record its node agent kept (the same findings, the same exit codes). Exit
0 when nothing of warning or worse was found, 1 when something was, 2 on an error.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddptop import api
from ddptop.api.looking import DEFAULT_WATCH_S
from ddptop.cli.evidence_warnings import warn
from ddptop.diagnosis import Finding, FindingsReport
from ddptop.errors import FindingsPresent, UsageError
from ddptop.textfmt import rank_ranges

MAX_WATCH_S = 24 * 3600.0

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add doctor's options."""
    parser.add_argument("target", nargs="*",
                        help="job id, MASTER_ADDR:MASTER_PORT, a recording/bundle file, or the evidence a "
                             "job left (folders or files of Flight Recorder dumps, torchrun's log, "
                             "torchelastic error files) (default: the only job here)")
    parser.add_argument("--json", action="store_true", help='print {"findings": [...]} (a stable interface)')
    parser.add_argument("--watch", type=float, default=DEFAULT_WATCH_S, metavar="SECONDS",
                        help=f"observe a live job for up to SECONDS (default {DEFAULT_WATCH_S:g})")


def run(args: argparse.Namespace) -> int:
    """Diagnose, print the findings; FindingsPresent (exit 1) if any is warning or worse."""
    watch = float(args.watch)
    if not 0 < watch <= MAX_WATCH_S:
        raise UsageError(f"--watch must be between 0 and {MAX_WATCH_S:g} seconds, not {args.watch}")
    warnings: list[str] = []
    try:
        report = api.diagnose(*args.target, watch=watch, warnings=warnings)
    finally:
        warn(warnings)
    if args.json:
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
        sys.stdout.flush()
    else:
        Console().print(render(report, report.ranks_seen))
    bad = [f for f in report.findings if f.at_least("warning")]
    if bad:
        kinds = Counter(f.kind for f in bad)
        raise FindingsPresent(f"{len(bad)} finding(s) of warning or worse: "
                              + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.items()))
    return 0


def render(report: FindingsReport, ranks_seen: int) -> Table:
    """The findings as a rich table: severity, kind, ranks, then title, evidence and remedy."""
    table = Table(title=f"ddptop doctor: job {report.job_id or '?'}, {ranks_seen} ranks, "
                        f"{len(report.findings)} finding(s)", show_lines=True)
    table.add_column("severity")
    table.add_column("kind")
    table.add_column("ranks")
    table.add_column("finding")
    if not report.findings:
        # No rank seen (a console log that names none): nothing is proven either way.
        table.add_row(Text("ok", style="green"), "", "", "nothing wrong found" if ranks_seen else
                      "nothing conclusive (what was read, and what would tell: the warnings above)")
    for f in report.findings:
        table.add_row(Text(f.severity, style=_STYLE.get(f.severity, "")), f.kind,
                      rank_ranges(f.ranks), _details(f))
    return table


def _details(f: Finding) -> Text:
    text = Text(f.title, style="bold")
    for line in f.evidence:
        text.append(f"\n  {line}")
    if f.remedy:
        text.append("\nfix: ", style="green")
        text.append(f.remedy)
    return text
