"""``ddptop doctor [--json] [--watch SECONDS] [TARGET]``: diagnose a job or a recording.

Attaches to every rank (one selector thread, :class:`~ddptop.client.live.LiveSource`),
folds what arrives into a :class:`~ddptop.model.job.JobModel` for up to SECONDS, then
prints the findings of :func:`ddptop.diagnosis.diagnose`. A TARGET that is a file is read
as a recording or bundle instead, and a job that has ended is read from the black-box
record its node agent kept (the same findings, the same exit codes). Exit 0 when nothing
of warning or worse was found, 1 when something was, 2 on an error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddptop import auth
from ddptop.bundle.reader import build_model, end_time
from ddptop.cli.evidence_args import ended_model, evidence_paths, unreachable_in_record, warn
from ddptop.client.collect import stuck_entries
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import JobTarget, resolve
from ddptop.client.watch import watching
from ddptop.diagnosis import Finding, FindingsReport, findings_for_model
from ddptop.errors import DdptopError, FindingsPresent, UsageError
from ddptop.evidence.scan import load_evidence
from ddptop.model.job import JobModel
from ddptop.textfmt import human_duration, rank_ranges

log = logging.getLogger(__name__)

DEFAULT_WATCH_S = 3.0
MAX_WATCH_S = 24 * 3600.0
TICK_S = 0.2
MIN_STATES = 2  # states per rank before an early stop: one sample cannot show a trend

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
    model, now = load_target(args.target, watch)
    findings = findings_for_model(model, now)
    report = FindingsReport(findings=findings, job_id=model.job_id, time=now)
    if args.json:
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
        sys.stdout.flush()
    else:
        Console().print(render(report, len(model.ranks)))
    bad = [f for f in findings if f.at_least("warning")]
    if bad:
        kinds = Counter(f.kind for f in bad)
        raise FindingsPresent(f"{len(bad)} finding(s) of warning or worse: "
                              + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.items()))
    return 0


def load_target(targets: list[str], watch_s: float) -> tuple[JobModel, float]:
    """The job the command line names, as a model and the moment it describes: evidence
    files (dumps, logs, recordings), an ended job's record, or a live job watched for a while."""
    paths = evidence_paths(targets)
    if paths:
        contents = load_evidence(paths)
        warn(contents.warnings)
        return build_model(contents), end_time(contents)
    target = resolve(targets[0] if targets else None)
    if target.ended:
        return ended_model(target)
    return observe(target, watch_s)


def observe(target: JobTarget, watch_s: float,
            clock: Callable[[], float] = time.time) -> tuple[JobModel, float]:
    """Attach to a live job, fold its events for up to *watch_s*; return the model and the time.

    Stops early once every rank has sent ``MIN_STATES`` states (or is gone): by then each
    rank's history and current state are in, and waiting longer adds nothing to a snapshot.
    """
    feed = ModelFeed(target.job_id, target.world_size)
    start = time.monotonic()
    with watching(target, feed, token=auth.load_token()):
        settled = feed.wait_settled(range(target.world_size), watch_s, states=MIN_STATES, tick_s=TICK_S)
    if target.world_size and settled == target.world_size:
        log.debug("every rank reported %d states after %s", MIN_STATES,
                  human_duration(time.monotonic() - start))
    if not feed.heard_from_any():
        raise DdptopError(f"no rank of job {target.job_id} sent its state within "
                          f"{human_duration(watch_s)} (try a longer --watch)")
    for entry in stuck_entries(target):  # silent ranks of this host, read by the node agent
        feed.emit(entry)
    for event in unreachable_in_record(target, feed.model):  # hosts this one's agent lost
        feed.emit(event)
    return feed.model, clock()


def render(report: FindingsReport, ranks_seen: int) -> Table:
    """The findings as a rich table: severity, kind, ranks, then title, evidence and remedy."""
    table = Table(title=f"ddptop doctor: job {report.job_id or '?'}, {ranks_seen} ranks, "
                        f"{len(report.findings)} finding(s)", show_lines=True)
    table.add_column("severity")
    table.add_column("kind")
    table.add_column("ranks")
    table.add_column("finding")
    if not report.findings:
        table.add_row(Text("ok", style="green"), "", "", "nothing wrong found")
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
