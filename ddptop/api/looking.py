"""The api's looks at one job: its ranks' states, its findings, a stream of both, a bundle.

Each function returns what its verb's ``--json`` prints, as typed values: ``snapshot`` a
:class:`~ddptop.model.snapshot.JobSnapshot` (``ddptop snapshot --json``), ``diagnose`` a
:class:`~ddptop.diagnosis.finding.FindingsReport` (``ddptop doctor --json``). The verbs are
thin printers over these functions, so a script and a person see the same answer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ddptop import auth
from ddptop.api.targets import (
    Target,
    ended_model,
    evidence_paths,
    job_of,
    last_known,
    unreachable_in_record,
    wait_closed,
)
from ddptop.bundle.reader import build_model, end_time
from ddptop.client.capture import ExportSummary, Progress, export_bundle, export_contents
from ddptop.client.collect import stuck_entries
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import JobTarget
from ddptop.client.watch import live_snapshot, watching
from ddptop.diagnosis import Finding, FindingsReport, findings_for_model
from ddptop.diagnosis.claims import Claim
from ddptop.diagnosis.story import blames
from ddptop.errors import DdptopError, UsageError
from ddptop.evidence.scan import load_evidence
from ddptop.model.job import JobModel
from ddptop.model.snapshot import JobSnapshot, with_last_known
from ddptop.textfmt import human_duration

DEFAULT_WATCH_S = 3.0
# Said where a console log was read and no finding names a cause with certainty (#46): what
# was recognised is in the evidence's warnings; this says what would tell (exit 0 or 1 as ever).
NOTHING_CONCLUSIVE = ("nothing conclusive: no statement in the evidence names a culprit with certainty; "
                      "what would tell: every rank's own lines with their prefix (torchrun --tee 3, srun -l, "
                      "torch >= 2.2's [rankN]:), Flight Recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE=2000, "
                      "TORCH_NCCL_DUMP_ON_TIMEOUT=1), PyTorch's desync report (TORCH_NCCL_DESYNC_DEBUG=1), "
                      "and "
                      "each host's kernel log (dmesg: the OOM killer, Xid errors)")
MIN_STATES = 2  # states per rank before diagnose stops early: one sample cannot show a trend
# While a doctor watches, this host's node agent's record is read again this often for hosts it
# found cut off (its ranks are then not waited for), where one read took less than RECORD_READ_S.
RECORD_EVERY_S = 1.0
RECORD_READ_S = 0.25
CLOSE_WAIT_S = 5.0  # an ended job's record still being closed by its agent: waited for this long at most


class Evidence(msgspec.Struct, kw_only=True):
    """What files a job left behind tell: every rank's last state, the findings, and what
    could not be read (one line each: a truncated dump, a log line of an unknown shape)."""

    snapshot: JobSnapshot
    findings: FindingsReport
    warnings: list[str]


class Update(msgspec.Struct, kw_only=True):
    """One look at a watched job: every rank's state and the findings at ``snapshot.job.time``."""

    snapshot: JobSnapshot
    findings: FindingsReport


def snapshot(target: Target = None, *, timeout: float = 5.0,
             warnings: list[str] | None = None) -> JobSnapshot:
    """Every rank's state, once: of a live job after each rank answered (or *timeout* ran
    out; those that did not are in ``job.unreachable`` with why, with their last known state),
    of an ended job as its job record tells it."""
    job = job_of(target, timeout)
    if job.ended:
        # No rank is left to ask: the job record says how each ended, at which step.
        wait_closed(job.job_id, timeout)
        model, at = ended_model(job, [] if warnings is None else warnings)
        return model.snapshot(at)
    snap = live_snapshot(job, auth.load_token(), timeout)
    if len(snap.ranks) < job.world_size:
        # Every rank of the job is listed: one that did not answer with its last state from
        # the job's black box, its age and the frame its node agent read from outside.
        snap = with_last_known(snap, last_known(job), job.world_size, time.time())
    return snap


def diagnose(*targets: Target, watch: float = DEFAULT_WATCH_S,
             warnings: list[str] | None = None) -> FindingsReport:
    """The findings of a job or of what it left behind, worst first: a live job is watched for
    up to *watch* seconds (less once every rank sent two states), an ended one read from its
    job record, paths read as evidence. Warnings about the evidence go to *warnings*."""
    said: list[str] = [] if warnings is None else warnings
    read = EvidenceRead()
    model, now = read_model(list(targets), watch, said, read)
    report = report_of(model, now, read.claims)
    said += inconclusive(read.console_logs, report)
    return report


def inconclusive(console_logs: int, report: FindingsReport) -> list[str]:
    """The "nothing conclusive" said where console logs were read and no finding names a cause."""
    return [NOTHING_CONCLUSIVE] if console_logs and not any(blames(f) for f in report.findings) else []


def read_evidence(*paths: str | os.PathLike[str]) -> Evidence:
    """What the files a job left (dumps, logs, error files, recordings, bundles) tell."""
    missing = [os.fspath(p) for p in paths if not (Path(p).exists() or Path(p).is_symlink())]
    if missing or not paths:
        raise UsageError(f"no such file or folder: {', '.join(missing)}" if missing else "no path given")
    contents = load_evidence([Path(p) for p in paths])
    model, now = build_model(contents), end_time(contents)
    report = report_of(model, now, contents.log_claims)
    said = list(contents.warnings) + inconclusive(contents.console_logs, report)
    return Evidence(snapshot=model.snapshot(now), findings=report, warnings=said)


def watch(target: Target = None, *, every: float = 1.0, timeout: float = 5.0) -> Iterator[Update]:
    """A live job, looked at every *every* seconds until every rank has ended or the caller
    stops iterating (the connections close then). An ended job yields its one last look."""
    job = job_of(target, timeout)
    if job.ended:
        model, at = ended_model(job, [])
        yield Update(snapshot=model.snapshot(at), findings=report_of(model, at))
        return
    feed = ModelFeed(job.job_id, job.world_size)
    ranks = range(job.world_size)
    with watching(job, feed, token=auth.load_token(), connect_timeout=timeout):
        feed.wait_settled(ranks, timeout)  # the first look has every rank that answers
        while True:
            model, now = feed.copy(), time.time()
            yield Update(snapshot=model.snapshot(now), findings=report_of(model, now))
            with feed.lock:
                if job.world_size and len(feed.gone) >= job.world_size:
                    return  # every rank is gone: nothing more will come
            time.sleep(every)


def export(target: Target | Sequence[str | os.PathLike[str]], path: str | os.PathLike[str], *,
           timeout: float = 5.0, progress: Progress | None = None,
           warnings: list[str] | None = None) -> ExportSummary:
    """A diagnosis bundle at *path* of a live job (ranks that do not answer are listed in its
    ``unanswered``, never fatal), an ended job (from its job record), or evidence: a path, or
    a list of them."""
    said = [] if warnings is None else warnings
    words: list[str | os.PathLike[str]] = []
    job: Target = None
    if isinstance(target, (list, tuple)):
        words = list(target)
        if not words:
            raise UsageError("no path given")
    elif isinstance(target, (str, os.PathLike)):
        words, job = [target], target
    elif isinstance(target, JobTarget):
        job = target
    paths = evidence_paths(words)
    if paths:
        contents = load_evidence(paths)
        said.extend(contents.warnings)
        return export_contents(contents, path, job_id=contents.manifest.job_id,
                               world_size=contents.manifest.world_size, progress=progress,
                               note=f"from evidence files ({contents.manifest.note})")
    resolved = job_of(job, timeout)
    if resolved.ended:
        assert resolved.record is not None
        contents = load_evidence([resolved.record], job_id=resolved.job_id)
        said.extend(contents.warnings)
        return export_contents(contents, path, job_id=resolved.job_id, world_size=resolved.world_size,
                               progress=progress, note="from the record of an ended job")
    return export_bundle(resolved, path, progress=progress, timeout=timeout)


@dataclass
class EvidenceRead:
    """What reading evidence files told beside the model: the console logs' claims."""

    claims: list[Claim] = field(default_factory=list)
    console_logs: int = 0  # console logs read (a "nothing conclusive" is said of them)


def read_model(targets: list[Target], watch_s: float, warnings: list[str],
               read: EvidenceRead | None = None) -> tuple[JobModel, float]:
    """The job *targets* name, as a model and the moment it describes: evidence files (dumps,
    logs, recordings), an ended job's record, or a live job watched for up to *watch_s*.
    What the evidence's console logs claim goes to *read*."""
    words = [t for t in targets if t is not None and not isinstance(t, JobTarget)]
    paths = evidence_paths(words) if len(words) == len(targets) else []
    if paths:
        contents = load_evidence(paths)
        warnings.extend(contents.warnings)
        if read is not None:
            read.claims += contents.log_claims
            read.console_logs += contents.console_logs
        return build_model(contents), end_time(contents)
    job = job_of(targets[0] if targets else None)
    if job.ended:
        # A job that just ended (doctor typed as srun returns): its agent may still be writing
        # how its last ranks ended; read the record once it is closed (or after a bound).
        wait_closed(job.job_id, CLOSE_WAIT_S)
        return ended_model(job, warnings)
    return observe(job, watch_s)


def observe(job: JobTarget, watch_s: float) -> tuple[JobModel, float]:
    """Attach to a live job, fold its events for up to *watch_s*; the model and the time.

    Stops early once every rank has sent ``MIN_STATES`` states (or is gone): by then each
    rank's history and current state are in, and waiting longer adds nothing to a snapshot.
    Ranks this host's node agent recorded unreachable (their host's beats stopped), before or
    while this watches, are not waited for: a doctor started just after a cut is done as soon
    as the agent's verdict is (its record is read again every second meanwhile, where one
    read is quick).
    """
    feed = ModelFeed(job.job_id, job.world_size)
    cut_off: set[int] = set()

    def recorded() -> float:
        began = time.monotonic()
        for event in unreachable_in_record(job, feed.model):
            feed.emit(event)
            cut_off.add(event.rank)
        return time.monotonic() - began

    again = job.record is not None and recorded() < RECORD_READ_S
    deadline = time.monotonic() + watch_s
    with watching(job, feed, token=auth.load_token()):
        while True:
            wanted = [r for r in range(job.world_size) if r not in cut_off]
            left = deadline - time.monotonic()
            step = min(left, RECORD_EVERY_S) if again else left
            if feed.wait_settled(wanted, step, states=MIN_STATES, tick_s=0.2) >= len(wanted) or step >= left:
                break
            recorded()
    if not feed.heard_from_any():
        raise DdptopError(f"no rank of job {job.job_id} sent its state within "
                          f"{human_duration(watch_s)} (try a longer --watch)")
    for entry in stuck_entries(job):  # silent ranks of this host, read by the node agent
        feed.emit(entry)
    recorded()  # hosts this one's agent lost
    return feed.model, time.time()


def report_of(model: JobModel, now: float, claims: Sequence[Claim] = ()) -> FindingsReport:
    """The findings of *model* at *now* (with a console log's *claims*), as ``doctor --json``
    prints them."""
    found: list[Finding] = findings_for_model(model, now, claims=claims)
    return FindingsReport(findings=found, job_id=model.job_id, time=now, ranks_seen=len(model.ranks))
