"""``ddptop export -o FILE [TARGET]``: a diagnosis bundle of a job, in one file.

Of a live job: progress goes to stderr while ranks are collected; ranks that do not answer
are listed in the summary (and the bundle's manifest) and make the exit code 3, never a
failure. Of a job that has ended (it crashed a moment ago, say): the bundle is written from
the black-box record its node agent kept.
"""

from __future__ import annotations

import argparse
import sys

from ddptop import api
from ddptop.api.targets import evidence_paths
from ddptop.cli.evidence_warnings import warn
from ddptop.client.collect import target_hosts, unreachable_summary
from ddptop.client.targets import JobTarget, resolve
from ddptop.errors import RankUnreachable


def configure(parser: argparse.ArgumentParser) -> None:
    """Add export's options."""
    parser.add_argument("target", nargs="*",
                        help="job id or MASTER_ADDR:MASTER_PORT (default: the only job here), or the "
                             "evidence a job left (folders or files of Flight Recorder dumps, torchrun log, "
                             "torchelastic error files, recordings)")
    parser.add_argument("-o", "--output", required=True, help="bundle file to write")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-stage timeout in seconds")


def _progress(stage: str, done: int, total: int) -> None:
    end = "\n" if done >= total else ""
    print(f"\rddptop export: {stage} {done}/{total}   ", end=end, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Write the bundle, print a one-line summary; exit 3 if some ranks did not answer."""
    paths = evidence_paths(args.target)
    target = paths or resolve(args.target[0] if args.target else None, store_timeout_s=args.timeout)
    warnings: list[str] = []
    try:
        summary = api.export(target, args.output, timeout=args.timeout, progress=_progress, warnings=warnings)
    finally:
        warn(warnings)
    print(summary.line(), file=sys.stderr)
    missing = {r: why for r, why in summary.unanswered.items() if not why.startswith("stacks:")}
    if missing and isinstance(target, JobTarget):
        why = unreachable_summary(missing, target_hosts(target))
        raise RankUnreachable(f"{why}; the bundle holds the rest")
    return 0
