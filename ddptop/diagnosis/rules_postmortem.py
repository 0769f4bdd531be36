"""Post-mortem rules: rank_lost and node_lost (catalog F4 after death).

When one rank fails, torchrun tears every other rank down within a second, and on gloo the
rank that aborts first is often a *victim* of the real culprit (the collective divergence,
:mod:`ddptop.diagnosis.rules_divergence`, names that). These rules order what happened by
time and name the first failure:

* ``rank_lost``: the first rank that failed (how: exception, fatal signal, a DataLoader
  worker's death, SIGKILL from outside, vanished), at which step and on which host, then a
  timeline of the others: consequences, and ranks merely torn down by the launcher. Where
  the record holds only ranks that failed because a peer was gone and nothing of some other
  ranks (another node's, the agents' exchange impossible), it says the cause is among those.
  NCCL's aborts are consequences; ranks that ended alike within a second are not ordered
  ("cannot tell");
* ``node_lost``: a host that vanished whole (its node agent and ranks unreachable, told by
  the agents of the nodes that survived).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

from ddptop.diagnosis import nccl_statements as nccl
from ddptop.diagnosis.common import ACTIVE, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.exit_reading import at_step, known_step, read_exit, told_by_log, where_known
from ddptop.diagnosis.finding import Finding, Severity
from ddptop.diagnosis.foresight import death_foreseen
from ddptop.diagnosis.limits_at_end import full_at_own_end, memory_words
from ddptop.diagnosis.rules_last_words import GLOO_SIZE, lost_peers
from ddptop.diagnosis.rules_resources import LIMITS
from ddptop.errortext import innermost
from ddptop.model.outcome import PEER_GONE
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.status import Status
from ddptop.textfmt import human_bytes

MAX_LINES = 16
TIE_S = 1.0  # ranks that ended alike within this: which failed first is not told by the clock
FATAL_SIGNALS = frozenset(("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"))
FAILED = frozenset((Status.CRASHED, Status.TERMINATED, Status.LOST))


def rank_lost(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
              config: DiagnosisConfig) -> list[Finding]:
    """The rank that failed first, how and at which step; then what happened to the others."""
    running = [s.rank for s in snapshot.ranks if s.status in ACTIVE]
    failed = [s for s in snapshot.ranks if s.status in FAILED
              and (s.status != Status.LOST or running or s.exited_at)]
    out: list[Finding] = []
    if failed:
        out.append(_failure(snapshot, failed, running, histories))
    exited = [s for s in snapshot.ranks if s.status == Status.EXITED and not s.exit_reason]
    if exited and running:
        # "cleanly" is status 0's word: an exit whose status nobody read is only an exit
        how = "exited cleanly" if all(s.exit_code == 0 for s in exited) else "exited"
        out.append(Finding(
            kind="rank_lost", severity="info", ranks=[s.rank for s in exited],
            title=(f"{ranks_text(s.rank for s in exited)} {how} while "
                   f"{ranks_text(running)} still {'runs' if len(running) == 1 else 'run'}"),
            evidence=[f"rank {s.rank}: exited at step {_last_step(s, histories)}, "
                      + ("status unknown" if s.exit_code is None else f"status {s.exit_code}")
                      for s in exited],
            remedy="expected at the end of training; earlier, the ranks ran different amounts of work",
        ))
    return out


def _failure(snapshot: JobSnapshot, failed: list[RankState], running: list[int],
             histories: dict[int, list[Sample]]) -> Finding:
    # NCCL's aborts (a watchdog timeout, "Some NCCL operations have failed") are consequences of
    # a collective that did not complete: ordered after the failures that can be causes.
    # A rank that died of SIGABRT without a word, beside ranks NCCL aborted, was most likely
    # aborted too (NCCL's watchdog ends a rank with SIGABRT; its lines may be lost).
    aborted = {s.rank for s in failed if nccl_aborted(s)}
    silent_abort = {s.rank for s in failed if aborted and s.exit_signal == "SIGABRT"
                    and not _EXCEPTION_LINE.search(s.exit_reason) and "what()" not in s.exit_reason}
    consequence = aborted | silent_abort
    order = sorted(failed, key=lambda s: (s.rank in consequence, _ended_at(s, histories), s.rank))
    stopped = _scheduler_stop(snapshot, order, histories)
    if stopped is not None:
        return stopped
    if all(s.rank in consequence for s in order):
        return _aborted_by_nccl(order, histories)
    first = order[0]
    t0 = _ended_at(first, histories)
    # The step where the evidence holds one (a log alone does not): else None, never 0.
    step = known_step(first, histories)
    why = snapshot.job.unreachable
    evidence = [f"{_offset(_ended_at(s, histories), t0)}rank {s.rank}{where_known(s)}: "
                f"{_how(s)}{at_step(s, histories, ', step ')}"
                + (f" ({why[s.rank]})" if s.status == Status.LOST and s.rank in why else "")
                + (f"; stack in {s.crash_file}" if s.crash_file and not s.worker_crashes else "")
                for s in order]
    told = death_foreseen(first, histories.get(first.rank, []), t0, shm=bool(_shm_full(first)))
    if told:
        evidence.insert(1, f"rank {first.rank}'s end was {told}")
    for crash in first.worker_crashes:
        if crash.stack:
            evidence.append(f"stack of worker pid {crash.pid} ({crash.crash_file}), innermost first:")
            evidence += [f"  {frame}" for frame in crash.stack[:6]]
    torn = sorted(s.rank for s in snapshot.ranks if s.status == Status.TORN_DOWN)
    if torn:
        when = max(_ended_at(s, histories) for s in snapshot.ranks if s.rank in torn) - t0
        evidence.append(f"{ranks_text(torn)} torn down by the launcher within {when:.2f} s "
                        "(victims, not causes)")
    if len(order) > 1:
        evidence.append(f"rank {first.rank} was the first to go silent")
    everyone = sorted(snapshot.ranks, key=lambda s: (_ended_at(s, histories), s.rank))
    peers, led_to = lost_peers(snapshot, everyone)
    evidence += peers
    if running:
        evidence.append(f"{ranks_text(running)} still running (they will hang in the next collective)")
    unseen = sorted(r for r, why in snapshot.job.unreachable.items() if why == "never seen")
    if unseen and PEER_GONE.search(first.exit_reason):
        # Only victims here: the cause is on a node whose news never reached this record.
        victims = [s.rank for s in order if PEER_GONE.search(s.exit_reason)]
        there = sorted(set(led_to) & set(unseen))
        if there:  # a victim's words name the address of the unseen ranks' host
            unseen = there
            where = f"; they lost their connection to {led_to[there[0]]}"
        else:
            where = f" ({cause_line(first.exit_reason, 120)})"
        title = (f"the first failure is not in this record: {ranks_text(victims)} failed because a peer was "
                 f"gone{where}; nothing is known here of {ranks_text(unseen)}, where the cause is")
        evidence.append(f"{ranks_text(unseen)} never reported to this record: run `ddptop doctor` on "
                        "their node, or let the node agents reach each other (`ddptop launch --bind`, "
                        "one DDPTOP_TOKEN)")
        return Finding(kind="rank_lost", severity="critical", ranks=unseen, title=title, evidence=evidence,
                       remedy="read the record of the node that ran those ranks", step=step, since=t0)
    if running and all(PEER_GONE.search(s.exit_reason) for s in order):
        # Every failure seen failed because a peer was gone, while ranks still run here: the peer
        # that went is among them, its own end not seen yet (seen a moment later, on a loaded
        # machine). Naming a victim as the cause meanwhile would be wrong: nobody is named.
        victims = [s.rank for s in order]
        return Finding(kind="rank_lost", severity="critical", ranks=[], victims=victims, certain=False,
                       title=(f"{ranks_text(victims)} failed because a peer was gone; "
                              f"{ranks_text(running)} still seen running: which one went is not seen yet"),
                       evidence=[*evidence, "the next look (its exit status, its last words) tells which"],
                       remedy="look again in a few seconds; `ddptop jobs` shows how each rank ended",
                       step=step, since=t0)
    hosts = {s.host for s in snapshot.ranks if s.host}
    where = f" on {first.host}" if len(hosts) > 1 and first.host else ""
    alike = _alike(first)
    tied = [s.rank for s in order if s.rank not in consequence and _alike(s) == alike
            and abs(_ended_at(s, histories) - t0) < TIE_S]
    if _shm_full(first):
        # The cause is the host's /dev/shm, not which rank's worker hit it first: every rank
        # that failed alike is named, under the kind of the cause (#34: shm_pressure).
        named = tied if len(tied) > 1 else [first.rank]
        return Finding(kind="shm_pressure", severity="critical", ranks=named,
                       victims=[s.rank for s in order if s.rank not in named],
                       title=f"{ranks_text(named)}{where} failed at step {step}: {_how(first)}",
                       evidence=evidence, remedy=_remedy(first), step=step, since=t0)
    by_rank = snapshot.by_rank()
    tied_hosts = {by_rank[r].host for r in tied}
    if len(tied) > 1 and len(hosts) > 1 and len(tied_hosts) == 1 and first.host:
        # One host's ranks ended alike at once, the others' did not: the cause is that host's.
        return Finding(kind="rank_lost", severity="critical", ranks=tied,
                       victims=[s.rank for s in order if s.rank not in tied],
                       title=(f"{ranks_text(tied)} on {first.host} ended alike within {TIE_S:.0f} s, first "
                              f"of the job, at step {step}: {_how(first)}"),
                       evidence=evidence, remedy=_remedy(first), step=step, since=t0)
    if len(tied) > 1:  # the same end at the same moment: which came first is a guess
        return Finding(kind="rank_lost", severity="critical", ranks=tied, certain=False,
                       victims=[s.rank for s in order if s.rank not in tied],
                       title=(f"{ranks_text(tied)} ended alike within {TIE_S:.0f} s ({_how(first)}): which "
                              "one failed first cannot be told from this evidence"),
                       evidence=[*evidence, "their own stderr (a traceback), a crash file or their Flight "
                                            "Recorder dumps would tell which failed first"],
                       remedy=_remedy(first), step=step, since=t0)
    at = at_step(first, histories, ", at step ")
    if all(told_by_log(s, histories) for s in snapshot.ranks):
        # Only logs tell of this job (no rank's dump or samples): its exit status read for what
        # it usually means, and the order of its lines never taken for the order of the failures
        # (#46). Where other ranks' dumps or samples are here, the whole job's evidence speaks.
        reading = read_exit(first, alone=len(snapshot.ranks) == 1 and first.rank == 0)
        ordered = len(order) == 1 or (t0 > 0 and _ended_at(order[1], histories) - t0 >= TIE_S)
        if not (reading.certain and ordered):
            because = reading.words if not reading.certain else "the log gives no times that order their ends"
            return Finding(kind="rank_lost", severity="warning", ranks=[s.rank for s in order], certain=False,
                           victims=[s.rank for s in order[1:]],
                           title=f"{ranks_text([first.rank])}{where}{at}: {_how(first)}; "
                                 f"from this log alone, {because}",
                           evidence=[*evidence, f"read: {reading.words}"], remedy=_remedy(first),
                           step=step, since=t0 or None)
        evidence.append(f"read: {reading.words}")
    if GLOO_SIZE.search(first.exit_reason):
        # gloo aborted it because a peer's data did not fit its op: either side of a collective
        # mismatch gets that abort, so failing first names no cause (#45: the mismatch does)
        return Finding(kind="rank_lost", severity="critical", ranks=[s.rank for s in order], certain=False,
                       title=(f"{ranks_text([first.rank])}{where} failed first{at}: {_how(first)}; gloo "
                              "aborts either side of a collective mismatch, so this names no cause"),
                       evidence=evidence, remedy=_remedy(first), step=step, since=t0 or None)
    return Finding(kind="rank_lost", severity="critical", ranks=[s.rank for s in order],
                   victims=[s.rank for s in order[1:]],
                   title=f"{ranks_text([first.rank])}{where} failed first{at}: {_how(first)}",
                   evidence=evidence, remedy=_remedy(first), step=step, since=t0 or None)


def _alike(s: RankState) -> str:
    """How *s* ended, in the words two ranks that ended alike share: its signal or exit code, its
    exception's line with the numbers left out ("died of SIGABRT (Signal 6 received by PID 38)"
    and a bare "died of SIGABRT" are alike)."""
    raised = [ln.strip() for ln in s.exit_reason.splitlines() if _EXCEPTION_LINE.match(ln.strip())]
    words = re.sub(r"\d+", "N", raised[-1]) if raised else ""
    return f"{s.exit_signal}|{'' if s.exit_signal else s.exit_code}|{words}|{s.exit_cause}|{s.status}"


def _offset(t: float, t0: float) -> str:
    """'+  1.20 s  ' after the first failure; nothing where either time is unknown (a log line
    without a time stamp: no placeholder stands for a fact the evidence does not hold)."""
    return f"+{t - t0:6.2f} s  " if t and t0 else ""


def nccl_aborted(s: RankState) -> bool:
    """True where the rank's end is NCCL taking it down (or PyTorch's checks raising) after a
    collective failed: its words say which collective, never which rank caused it."""
    reason = s.exit_reason
    marks = (nccl.ABORTED, "Watchdog caught", nccl.DESYNC_START, nccl.FINGERPRINT)
    return any(mark in reason for mark in marks)


def _aborted_by_nccl(order: list[RankState], histories: dict[int, list[Sample]]) -> Finding:
    victims = [s.rank for s in order]
    return Finding(
        kind="rank_lost", severity="warning", ranks=[], victims=victims, certain=False,
        title=(f"NCCL took {ranks_text(victims)} down after a collective failed or timed out: they are its "
               "victims, not its cause"),
        evidence=[f"rank {s.rank}: {cause_line(s.exit_reason, 200)}" for s in order[:MAX_LINES]],
        remedy=("read the collective finding for who they waited for; where there is none, the lines of the "
                "other ranks, their Flight Recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE) or PyTorch's desync "
                "report (TORCH_NCCL_DESYNC_DEBUG=1) would tell"),
        step=known_step(order[0], histories))


def node_lost(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
              config: DiagnosisConfig) -> list[Finding]:
    """Each host that vanished whole: its node agent and ranks unreachable, no exit seen."""
    lost: dict[str, list[RankState]] = defaultdict(list)
    for s in snapshot.ranks:
        if s.exit_cause == "node_lost":
            lost[s.host or "?"].append(s)
    out: list[Finding] = []
    for host, states in sorted(lost.items()):
        ranks = sorted(s.rank for s in states)
        since = min(s.exited_at or s.time for s in states)
        steps = [f"rank {s.rank}: last seen at step {_last_step(s, histories)}" for s in states]
        out.append(Finding(
            kind="node_lost", severity="critical", ranks=ranks,
            title=(f"host {host} was lost: its node agent and {ranks_text(ranks)} became unreachable at "
                   f"{time.strftime('%H:%M:%S', time.localtime(since))}, with no exit status or last words"),
            evidence=[*steps, "told by the node agents that survived (their exchange lost that node's agent "
                              "and could not reach it again)"],
            remedy=("the whole node went away (power, kernel panic, a network partition, the scheduler "
                    "taking the node): read that node's kernel log and the scheduler's; the ranks "
                    "elsewhere failed because of it"),
            since=since))
    return out


def cause_line(text: str, limit: int = 240) -> str:
    """The one line of a failure's text that says its cause: the innermost error's own line,
    and what it was raised as (a DataLoader worker's error, spawn's ProcessRaisedException and
    a chain of causes wrap it: :func:`ddptop.errortext.innermost`)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) <= 1:
        return (lines[0] if lines else "")[:limit]
    return innermost(text).text(limit)


SCHEDULER_WORDS = {
    "slurm_cancelled": "cancelled by SLURM (scancel)",
    "slurm_timeout": "stopped by SLURM at the job's time limit (DUE TO TIME LIMIT)",
    "slurm_preempted": "preempted by SLURM",
    "slurm_node_fail": "stopped by SLURM: a node of the job failed (NODE_FAIL)",
    "slurm_deadline": "stopped by SLURM at the job's deadline",
    "slurm_stopped": "stopped by SLURM (scancel or preemption: the job was ending)",
}


def _scheduler_stop(snapshot: JobSnapshot, order: list[RankState],
                    histories: dict[int, list[Sample]]) -> Finding | None:
    """The scheduler stopped the job (scancel, a time limit...): named as such, not a crash."""
    causes = {s.exit_cause for s in order}
    if len(causes) != 1 or next(iter(causes)) not in SCHEDULER_WORDS:
        return None
    words = SCHEDULER_WORDS[next(iter(causes))]
    stopped = sorted((s for s in snapshot.ranks if s.exit_cause in SCHEDULER_WORDS or s.status in FAILED
                      or s.status == Status.TORN_DOWN), key=lambda s: s.rank)
    ranks = [s.rank for s in stopped]
    t0 = min(_ended_at(s, histories) for s in order)
    steps = sorted({_last_step(s, histories) for s in order})
    at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}..{steps[-1]}"
    severity: Severity = "info" if "cancelled" in words else "warning"
    return Finding(kind="rank_lost", severity=severity, ranks=ranks,
                   title=(f"the job was {words} at {time.strftime('%H:%M:%S', time.localtime(t0))}: "
                          f"{ranks_text(ranks)} stopped at {at}"),
                   evidence=[f"rank {s.rank} on {s.host}: step {_last_step(s, histories)}"
                             + (f", {s.exit_signal}" if s.exit_signal else "") for s in stopped[:16]],
                   remedy=("not a failure of the training: resubmit (with a longer --time, or from the last "
                           "checkpoint); checkpoint often enough to lose little at a time limit"),
                   step=steps[0], since=t0)


def _how(s: RankState) -> str:
    """How one rank ended, in one line."""
    if s.exit_cause in SCHEDULER_WORDS:
        return SCHEDULER_WORDS[s.exit_cause]
    reason = cause_line(s.exit_reason)
    if PEER_GONE.search(s.exit_reason):
        return f"{cause_line(s.exit_reason, 200)} (a consequence: a peer was already gone)"
    shm = _shm_full(s)
    if shm:
        return shm
    full = full_at_own_end(s)
    if full is not None:  # whatever the words: torch.save on a full disk says "unexpected pos"
        return f"{full.words} ({reason[:200] or s.exit_signal or 'no reason left'})"
    if s.worker_crashes:
        w = s.worker_crashes[0]
        who = f"worker {w.worker_id} " if w.worker_id is not None else "worker "
        return (f"its DataLoader {who}(pid {w.pid}) died of {w.signal or 'an unknown cause'}; "
                f"the rank then failed ({reason[:160] or 'no reason left'})")
    sig = s.exit_signal
    if sig in FATAL_SIGNALS:
        return f"died of {sig}" + (f" ({reason})" if reason and reason != f"died of {sig}" else "")
    if sig == "SIGKILL" and s.exit_cause == "oom_kill":
        return "killed by the OOM killer: " + memory_words(s)
    if sig == "SIGKILL":
        return "killed (SIGKILL) from outside the job; the kernel names no OOM kill (scheduler, person?)"
    if sig in ("SIGTERM", "SIGINT", "SIGHUP") or s.status == Status.TERMINATED:
        return f"stopped by {sig or 'SIGTERM'} from outside the job"
    if s.exit_cause == "node_lost":
        return f"its host {s.host} vanished (node agent and ranks unreachable, no exit status or last words)"
    if s.status == Status.LOST:
        return "vanished without last words or an exit status (killed by SIGKILL from outside?)"
    if s.exit_code and (not reason or reason.startswith("SystemExit(")):
        # sys.exit's message, or a status alone (a bare raise SystemExit, os._exit)
        return f"exited with status {s.exit_code}" + (f": {reason}" if reason else "")
    if reason:
        return reason
    return "died, no reason left"


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]{0,120}(Error|Exception|Interrupt|Exit|Warning)\b.{0,2000}$")
_SHM_ERROR = re.compile(r"No space left on device|unable to write to file </torch_|Bus error|shared memory",
                        re.IGNORECASE)


def _shm_full(s: RankState) -> str:
    """'/dev/shm is full ...' when the rank's failure is a shared-memory write that did not fit."""
    text = s.exit_reason + " ".join(w.signal for w in s.worker_crashes)
    if not _SHM_ERROR.search(text) or not any(w in text for w in ("DataLoader", "/torch_", "/dev/shm")):
        return ""
    size = (f" ({human_bytes(s.shm_total_bytes)}, {human_bytes(s.shm_used_bytes)} used at the last sample)"
            if s.shm_total_bytes else "")
    worker = re.search(r"DataLoader worker process (\d+)", s.exit_reason)
    who = f"DataLoader worker {worker.group(1)} of rank {s.rank}" if worker else f"rank {s.rank}"
    return f"/dev/shm is full{size}: {who} could not hand over its batch ({cause_line(s.exit_reason, 320)})"


def _ended_at(state: RankState, histories: dict[int, list[Sample]]) -> float:
    # The agent's exit time when there is one; else the rank's own last sample with progress
    # (the stub a viewer builds for a dead rank carries the viewer's clock and step 0).
    if state.exited_at:
        return state.exited_at
    samples = [s for s in histories.get(state.rank, []) if s.step or s.seq]
    return samples[-1].time if samples else state.time


def _last_step(state: RankState, histories: dict[int, list[Sample]]) -> int:
    samples = histories.get(state.rank, [])
    return max([state.step] + [s.step for s in samples])


def _remedy(state: RankState) -> str:
    reason = f"{state.exit_reason} {state.exit_signal}".lower()
    if _shm_full(state):
        return ("give the job a bigger /dev/shm (docker --shm-size, a Kubernetes emptyDir of medium "
                "Memory), use fewer DataLoader workers or a smaller prefetch_factor, or "
                "torch.multiprocessing.set_sharing_strategy('file_system')")
    full = full_at_own_end(state)
    if full is not None and full.cause == "disk":
        return LIMITS[-1].remedy
    if state.exit_cause == "oom_kill":
        return ("the rank outgrew its memory: lower the batch size, num_workers or prefetch_factor, look "
                "for a leak in its RSS trend (ddptop replay), or raise the memory limit of the job")
    if state.worker_crashes:
        return ("a DataLoader worker died (native code in the dataset or its transforms; 'Killed' is the OOM "
                "killer): read the worker's stack, rerun with num_workers=0 to see it in the main process, "
                "and lower num_workers / prefetch_factor if memory is short")
    if "sigsegv" in reason or "signal 11" in reason or "segmentation" in reason:
        return ("a native crash: read the stack in the crash file; check that every rank has the same GPU "
                "model/compute capability, driver, CUDA and cuDNN build, and GPU memory headroom; try one "
                "GPU, then grow")
    if "sigkill" in reason or state.status == Status.LOST:
        return ("killed from outside: check the node's memory (dmesg | grep -i kill: the OOM killer), the "
                "scheduler's logs, or whoever sent the signal")
    if "outofmemory" in reason.replace(" ", "") or "out of memory" in reason:
        return "reduce the batch size or enable activation checkpointing; check other processes on that GPU"
    return "read the exception and stack above (crash file); fix it on that rank, then restart the job"
