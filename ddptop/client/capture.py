"""Export a diagnosis bundle of a live job: everything ddptop can tell, in one file.

Shared by ``ddptop export`` and the dashboard's ``e`` key. One live source (a single
selector thread) attaches to every rank; what arrives (states, histories, stacks, Flight
Recorder dumps, connection changes) is kept, then host facts, dead ranks' crash files and
the findings are added, and the bundle is written atomically. Ranks that do not answer
are listed in the manifest with why; they never fail the export.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddptop import auth
from ddptop._version import __version__
from ddptop.bundle.format import SCHEMA_VERSION, CrashFile, FindingsRecord, HostFacts, Manifest
from ddptop.bundle.reader import Contents, build_model, end_time
from ddptop.bundle.record_dir import read_recording
from ddptop.bundle.writer import BundleWriter
from ddptop.client.live import LiveSource
from ddptop.client.model_feed import ModelFeed
from ddptop.client.targets import JobTarget, resolve
from ddptop.client.watch import watching
from ddptop.diagnosis import findings_for_model
from ddptop.diagnosis.claims import Claim
from ddptop.errors import UsageError
from ddptop.model.job import JobModel
from ddptop.model.rank_view import LOST
from ddptop.protocol import Event, FrTraceMsg, RankState, RecordEntry
from ddptop.store import discovery
from ddptop.store.remains import read_text_tail

log = logging.getLogger(__name__)

# progress(stage, done, total): stage is "states", "stacks", "traces", "writing".
Progress = Callable[[str, int, int], None]
CRASH_READ_BYTES = 256 * 1024


@dataclass
class ExportSummary:
    """What an export wrote, and which ranks did not answer (with why)."""

    path: Path
    job_id: str
    world_size: int
    answered: list[int]
    unanswered: dict[int, str]
    frames: int
    size_bytes: int
    seconds: float
    findings: int = 0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One-line summary for a terminal."""
        missing = (f"; {len(self.unanswered)} did not answer: "
                   + ", ".join(f"{r} ({why})" for r, why in sorted(self.unanswered.items())[:8])
                   if self.unanswered else "")
        return (f"exported job {self.job_id}: {len(self.answered)}/{self.world_size} ranks, "
                f"{self.findings} finding(s), {self.size_bytes / 1024:.0f} KiB in {self.seconds:.1f} s "
                f"-> {self.path}{missing}")


def _target_of(source_or_target: object) -> JobTarget:
    if isinstance(source_or_target, JobTarget):
        return source_or_target
    if isinstance(source_or_target, LiveSource):
        return source_or_target.target
    if source_or_target is None or isinstance(source_or_target, str):
        return resolve(source_or_target)
    raise UsageError("export needs a live job (a replayed file is already a bundle)")


def read_crash_file(job_id: str, rank: int) -> CrashFile | None:
    """A dead rank's faulthandler file from this host's runtime dir (tail, bounded)."""
    path = discovery.rank_file(job_id, rank, "crash")
    text, truncated = read_text_tail(path, CRASH_READ_BYTES)  # capped, never through a link
    if len(text.strip().splitlines()) <= 1:
        return None  # unreadable, or only the header line: the rank never dumped anything
    return CrashFile(rank=rank, name=path.name, text=text, truncated=truncated)


def host_facts(states: list[RankState]) -> list[HostFacts]:
    """Per-host facts as the ranks on each host reported them."""
    by_host: dict[str, list[RankState]] = {}
    for st in states:
        by_host.setdefault(st.host, []).append(st)
    out: list[HostFacts] = []
    for host, group in sorted(by_host.items()):
        latest = max(group, key=lambda s: s.time)
        facts = {
            "ranks": str(len(group)),
            "cpu_count": str(latest.cpu_count) if latest.cpu_count is not None else "",
            "load_avg": " ".join(f"{x:.2f}" for x in latest.load_avg),
            "mem_available_bytes": str(latest.mem_available_bytes or ""),
            "shm_used_bytes": str(latest.shm_used_bytes or ""),
            "shm_total_bytes": str(latest.shm_total_bytes or ""),
            "loader_workers": str(sum(s.loader_workers for s in group)),
            "backend": latest.backend,
            "gpus": ", ".join(sorted({s.gpu.name for s in group if s.gpu and s.gpu.name})),
            "torch": ", ".join(sorted({s.versions.torch or "" for s in group} - {""})),
            "cuda": ", ".join(sorted({s.versions.cuda or "" for s in group} - {""})),
            "nccl": ", ".join(sorted({s.versions.nccl or "" for s in group} - {""})),
            "driver": ", ".join(sorted({s.versions.driver or "" for s in group} - {""})),
        }
        out.append(HostFacts(host=host, ranks=sorted(s.rank for s in group),
                             facts={k: v for k, v in facts.items() if v}))
    return out


def export_bundle(source_or_target: JobTarget | LiveSource | str | None, path: str | os.PathLike[str],
                  progress: Progress | None = None, *, token: str | None = None,
                  timeout: float = 5.0) -> ExportSummary:
    """Collect a live job into a bundle at *path*; ranks that do not answer are listed, not fatal."""
    began = time.monotonic()
    report: Progress = progress or (lambda stage, done, total: None)
    target = _target_of(source_or_target)
    ranks = list(range(target.world_size))
    feed = ModelFeed(target.job_id, target.world_size, keep_events=True)
    unanswered: dict[int, str] = {}
    with watching(target, feed, token=token if token is not None else auth.load_token(),
                  connect_timeout=timeout) as live:
        feed.wait_settled(ranks, timeout, history=True,
                          progress=lambda done: report("states", done, len(ranks)))
        live_ranks = sorted(e.rank for e in target.endpoints)
        report("stacks", 0, len(live_ranks))
        stacks = live.request_stacks(timeout=timeout)
        report("stacks", len(stacks.stacks), len(live_ranks))
        report("traces", 0, len(live_ranks))
        traces = live.request_fr_traces(timeout=timeout)
        report("traces", len(traces), len(live_ranks))
    with feed.lock:  # stop() joins the source's thread, but only for so long
        events: list[Event] = list(feed.events)
        model = feed.model
    # Replies came through emit; failed FR requests did not, so keep their reasons too.
    now = time.time()
    for rank, trace in sorted(traces.items()):
        if trace.error:
            events.append(RecordEntry(time=now, rank=rank, message=FrTraceMsg(
                rank=rank, time=trace.time, error=trace.error)))
    for rank, why in stacks.errors.items():
        unanswered[rank] = f"stacks: {why}"
    for rank in ranks:
        view = model.ranks.get(rank)
        if view is None or view.state is None:
            reason = view.connection_reason if view is not None and view.connection_reason else "no state"
            unanswered[rank] = reason
    states = [v.state for v in model.ranks.values() if v.state is not None]
    dead = {e.rank for e in target.dead} | {r for r, v in model.ranks.items() if v.connection == LOST}
    crash_files = [c for c in (read_crash_file(target.job_id, r) for r in sorted(dead)) if c is not None]
    findings = _findings(model, now)
    manifest = Manifest(schema_version=SCHEMA_VERSION, kind="bundle", created=now, job_id=target.job_id,
                        world_size=target.world_size, ddptop_version=__version__,
                        hosts=sorted({s.host for s in states}), unanswered=unanswered)
    report("writing", 0, 1)
    writer = write_bundle(path, manifest, events, host_facts(states), crash_files, findings, "export")
    report("writing", 1, 1)
    return ExportSummary(path=Path(path), job_id=target.job_id, world_size=target.world_size,
                         answered=[s.rank for s in sorted(states, key=lambda s: s.rank)],
                         unanswered=unanswered, frames=writer.frames, size_bytes=writer.bytes_written,
                         seconds=time.monotonic() - began, findings=len(findings.findings))


def export_record(target: JobTarget, path: str | os.PathLike[str],
                  progress: Progress | None = None) -> ExportSummary:
    """A bundle of a job that has ended, from the black-box recording its node agent kept.

    Everything the recording holds (its full-rate last minutes and the thinned history before
    them), the ranks' crash files, host facts from their final states and the findings at
    the moment the recording ends: the same bundle an export of the live job would have been.
    """
    assert target.record is not None
    return export_contents(read_recording(target.record), path, job_id=target.job_id,
                           world_size=target.world_size, progress=progress,
                           note="from the record of an ended job")


def export_contents(contents: Contents, path: str | os.PathLike[str], *, job_id: str, world_size: int,
                    progress: Progress | None = None, note: str) -> ExportSummary:
    """A bundle of what a file, a record or a set of evidence files holds (already read)."""
    began = time.monotonic()
    report: Progress = progress or (lambda stage, done, total: None)
    target_job, target_world = job_id, world_size
    model = build_model(contents)
    end = end_time(contents)
    states = [v.state for v in model.ranks.values() if v.state is not None]
    world = max(target_world, model.world_size)
    manifest = Manifest(schema_version=SCHEMA_VERSION, kind="bundle", created=time.time(),
                        job_id=target_job, world_size=world, ddptop_version=__version__,
                        hosts=sorted({s.host for s in states}), unanswered=dict(contents.manifest.unanswered),
                        note=f"exported {note} ({len(contents.events)} events)")
    findings = _findings(model, end, contents.log_claims)
    report("writing", 0, 1)
    writer = write_bundle(path, manifest, contents.events, host_facts(states),
                          list(contents.crash_files.values()), findings, f"export {note}")
    report("writing", 1, 1)
    return ExportSummary(path=Path(path), job_id=target_job, world_size=world,
                         answered=sorted(s.rank for s in states),
                         unanswered=dict(contents.manifest.unanswered),
                         frames=writer.frames, size_bytes=writer.bytes_written,
                         seconds=time.monotonic() - began, findings=len(findings.findings),
                         notes=[note])


def write_bundle(path: str | os.PathLike[str], manifest: Manifest, events: list[Event],
                 hosts: list[HostFacts], crashes: list[CrashFile], findings: FindingsRecord,
                 reason: str) -> BundleWriter:
    """Write a whole bundle atomically: events, host facts, crash files, findings (or nothing)."""
    writer = BundleWriter(path, manifest, atomic=True, flush_interval_s=3600.0)
    try:
        for frame in [*events, *hosts, *crashes, findings]:
            writer.write(frame)
        writer.close(reason)
    except BaseException:
        writer.abort()
        raise
    return writer


def _findings(model: JobModel, now: float, claims: Sequence[Claim] = ()) -> FindingsRecord:
    """The findings at *now*, with what the evidence's console logs claimed (kept beside them:
    a bundle of a log is judged as the log was)."""
    try:
        found = findings_for_model(model, now, claims=claims)
    except Exception as exc:  # the bundle matters more than a diagnosis bug
        log.warning("diagnosis failed during export: %s", exc)
        return FindingsRecord(time=now, error=f"diagnosis failed: {exc}", claims=list(claims))
    return FindingsRecord(time=now, findings=found, claims=list(claims))
