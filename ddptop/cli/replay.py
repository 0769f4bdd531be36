"""``ddptop replay FILE|JOB``: open a recording, a bundle or an ended job's record in the dashboard.

``--info`` prints what the file holds instead (no terminal UI): handy in scripts and to
check a file. A damaged recording opens up to the damage, with a warning on stderr.
"""

from __future__ import annotations

import argparse
import time

from ddptop.api.targets import evidence_paths
from ddptop.bundle.replay_source import ReplaySource
from ddptop.cli.evidence_warnings import warn
from ddptop.client.targets import resolve
from ddptop.errors import TargetNotFound
from ddptop.evidence.scan import load_evidence


def configure(parser: argparse.ArgumentParser) -> None:
    """Add replay's options."""
    parser.add_argument("file", nargs="+",
                        help="a recording (ddptop record), a bundle (ddptop export), the id of a job on this "
                             "host (its black-box record), or the evidence a job left (folders or files of "
                             "Flight Recorder dumps, torchrun's log, torchelastic error files)")
    parser.add_argument("--info", action="store_true", help="print what the file holds and exit")


def describe(source: ReplaySource) -> str:
    """A few lines about the file: manifest, span, ranks, extras."""
    m = source.manifest
    span = source.end_time - source.start_time
    model = source.model_at(source.end_time)
    statuses = model.statuses(source.end_time)
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.created))
    lines = [
        f"{m.kind} of job {m.job_id}: {m.world_size} ranks on {', '.join(m.hosts) or '?'}, "
        f"written by ddptop {m.ddptop_version} at {created}",
        f"{len(source.contents.events)} events over {span:.1f} s; "
        f"ranks at the end: {', '.join(f'{r}={s}' for r, s in statuses.items()) or 'none'}",
        "steps at the end: " + (", ".join(f"{r}={v.state.step}" for r, v in sorted(model.ranks.items())
                                          if v.state is not None) or "none"),
    ]
    if m.unanswered:
        lines.append("did not answer: " + ", ".join(f"{r} ({w})" for r, w in sorted(m.unanswered.items())))
    if source.contents.crash_files:
        lines.append("crash files: ranks " + ", ".join(str(r) for r in sorted(source.contents.crash_files)))
    if source.contents.findings is not None:
        lines.append(f"findings at export: {len(source.contents.findings.findings)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Load the file (errors are one line), then open the dashboard on it."""
    paths = evidence_paths(args.file)
    job_id = ""
    if not paths:
        target = resolve(args.file[0])
        if target.record is None:
            raise TargetNotFound(f"job {target.job_id} left no record directory on this host "
                                 "(recording was off?)")
        paths, job_id = [target.record], target.job_id
    source = ReplaySource(load_evidence(paths, job_id=job_id))
    warn(source.warnings)
    if args.info:
        print(describe(source))
        return 0
    from ddptop.tui.app import DdptopApp  # textual only when a dashboard is wanted

    DdptopApp(source=source).run()
    return 0
