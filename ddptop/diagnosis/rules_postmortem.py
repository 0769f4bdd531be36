"""Post-mortem rules: rank_lost and the collective divergence (catalog F4, F5 after death).

When one rank fails, torchrun tears every other rank down within a second, and on gloo the
rank that aborts first is often a *victim* of the real culprit. These rules order what
happened by time and name the first cause:

* ``collective_divergence`` (kind ``collective_mismatch``): every rank's last words carry
  its last collectives from a fresh Flight Recorder read; the first seq at which ranks ran
  different ops names the rank that diverged (the minority), with each side's op and step;
* ``rank_lost``: the first rank that failed (how: exception, fatal signal, a DataLoader
  worker's death, SIGKILL from outside, vanished), at which step and on which host, then a
  timeline of the others: consequences, and ranks merely torn down by the launcher. Where
  the record holds only ranks that failed because a peer was gone and nothing of some other
  ranks (another node's, the agents' exchange impossible), it says the cause is among those;
* ``node_lost``: a host that vanished whole (its node agent and ranks unreachable, told by
  the agents of the nodes that survived).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

from ddptop.diagnosis.common import ACTIVE, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding, Severity
from ddptop.diagnosis.rules_last_words import lost_peers
from ddptop.model.outcome import PEER_GONE
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import PendingOp, RankState, Sample
from ddptop.status import Status
from ddptop.textfmt import human_bytes, op_text

FATAL_SIGNALS = frozenset(("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"))
FAILED = frozenset((Status.CRASHED, Status.TERMINATED, Status.LOST))
SAME_OPS_REMEDY = ("every rank must call the same collectives in the same order: look for a collective "
                   "under a condition that depends on the rank or on its data (a metric all-reduce one "
                   "rank skips, a loop whose length differs per rank: an unseeded split)")


def collective_divergence(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                          config: DiagnosisConfig) -> list[Finding]:
    """The first seq at which ranks' last collectives differ, from their last words."""
    if len([s for s in snapshot.ranks if s.status in ACTIVE]) >= 2:
        return []  # the live collective_mismatch rule judges running ranks by their pending ops
    reported = [s for s in snapshot.ranks if any(g.recent for g in s.collectives)]
    if len(reported) < 2:
        return []
    out: list[Finding] = []
    for pg in sorted({g.pg for s in reported for g in s.collectives if g.recent}):
        by_seq: dict[int, dict[int, PendingOp]] = defaultdict(dict)
        for s in reported:
            for g in s.collectives:
                if g.pg == pg:
                    for op in g.recent:
                        by_seq[op.seq][s.rank] = op
        found = _first_divergence(by_seq)
        if found is not None:
            out.append(_divergence_finding(snapshot, pg, *found))
            break  # the first diverging group is the cause; the others follow from it
        left = _left_early(snapshot, pg, by_seq)
        if left is not None:
            out.append(left)
            break
    return out


def _left_early(snapshot: JobSnapshot, pg: str,
                by_seq: dict[int, dict[int, PendingOp]]) -> Finding | None:
    """Ranks that ended cleanly before a collective their peers entered and died in.

    Same ops at every seq both sides ran, yet some ranks exit with code 0 after seq N while
    the others entered N+1 and never came back: the clean ones skipped a collective (a
    skipped op of the same shape as the next one shifts them silently) or ran out of work.
    """
    states = snapshot.by_rank()
    last: dict[int, int] = {}
    for seq in sorted(by_seq):
        for rank in by_seq[seq]:
            last[rank] = seq
    clean = {r for r in last if states[r].status == Status.EXITED}
    if not clean or not set(last) - clean:
        return None
    top = max(last.values())
    early = sorted(r for r in clean if last[r] < top)
    waiting = sorted(r for r in last if last[r] == top and r not in clean)
    if not early or not waiting:
        return None
    step = _step(states, early)
    op = by_seq[top][waiting[0]]
    where = "" if pg == "0" else f" of process group {pg}"
    return Finding(
        kind="collective_mismatch", severity="critical", ranks=early, step=step,
        title=(f"{ranks_text(early)} exited cleanly after collective #{last[early[0]]}{where} at step "
               f"{step}, while {ranks_text(waiting)} entered #{top} ({op_text(op)}) and waited for "
               f"{ranks_text(early)} there: the ranks ran different numbers of collectives"),
        evidence=[f"rank {r}: last collective #{last[r]} ({op_text(by_seq[last[r]][r])}), "
                  f"step {states[r].step}, {states[r].status}" for r in sorted(last)],
        remedy=SAME_OPS_REMEDY)


def _signature(op: PendingOp) -> tuple[str, str]:
    return op.op, repr(op.sizes[0] if op.sizes else [])


Divergence = tuple[int, list[list[int]], dict[int, PendingOp]]  # seq, sides (smallest first), ops


def _first_divergence(by_seq: dict[int, dict[int, PendingOp]]) -> Divergence | None:
    for seq in sorted(by_seq):
        ops = by_seq[seq]
        sides: dict[tuple[str, str], list[int]] = defaultdict(list)
        for rank, op in sorted(ops.items()):
            sides[_signature(op)].append(rank)
        if len(sides) > 1:
            # Smallest side first: the odd one out is the culprit (ties: lowest rank first).
            return seq, sorted(sides.values(), key=lambda ranks: (len(ranks), ranks)), ops
    return None


def _divergence_finding(snapshot: JobSnapshot, pg: str, seq: int, sides: list[list[int]],
                        ops: dict[int, PendingOp]) -> Finding:
    states = snapshot.by_rank()
    odd, rest = sides[0], [r for side in sides[1:] for r in side]
    certain = len(odd) < len(sides[1])
    lines = [f"{ranks_text(side)}: {op_text(ops[side[0]])} (step {_step(states, side)})" for side in sides]
    where = f"seq {seq}" + (f" of process group {pg}" if pg != "0" else "")
    title = (f"{ranks_text(odd)} ran a different collective at {where}: {op_text(ops[odd[0]])}, while "
             f"{ranks_text(rest)} ran {op_text(ops[rest[0]])}")
    if not certain:
        title += " (as many ranks on each side: which one diverged cannot be told)"
    return Finding(kind="collective_mismatch", severity="critical", ranks=odd, title=title,
                   evidence=[f"last collectives from the ranks' last words, at {where}:", *lines],
                   remedy=SAME_OPS_REMEDY, step=_step(states, odd))


def _step(states: dict[int, RankState], ranks: list[int]) -> int:
    return min(states[r].step for r in ranks if r in states) if any(r in states for r in ranks) else 0


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
        out.append(Finding(
            kind="rank_lost", severity="info", ranks=[s.rank for s in exited],
            title=(f"{ranks_text(s.rank for s in exited)} exited cleanly while "
                   f"{ranks_text(running)} still run"),
            evidence=[f"rank {s.rank}: exited at step {_last_step(s, histories)}" for s in exited],
            remedy="expected at the end of training; earlier, the ranks ran different amounts of work",
        ))
    return out


def _failure(snapshot: JobSnapshot, failed: list[RankState], running: list[int],
             histories: dict[int, list[Sample]]) -> Finding:
    order = sorted(failed, key=lambda s: (_ended_at(s, histories), s.rank))
    stopped = _scheduler_stop(snapshot, order, histories)
    if stopped is not None:
        return stopped
    first = order[0]
    t0 = _ended_at(first, histories)
    step = _last_step(first, histories)
    why = snapshot.job.unreachable
    evidence = [f"+{_ended_at(s, histories) - t0:6.2f} s  rank {s.rank} on {s.host} (pid {s.pid}): "
                f"{_how(s)}, step {_last_step(s, histories)}"
                + (f" ({why[s.rank]})" if s.status == Status.LOST and s.rank in why else "")
                + (f"; stack in {s.crash_file}" if s.crash_file and not s.worker_crashes else "")
                for s in order]
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
    hosts = {s.host for s in snapshot.ranks if s.host}
    where = f" on {first.host}" if len(hosts) > 1 and first.host else ""
    return Finding(kind="rank_lost", severity="critical", ranks=[s.rank for s in order],
                   title=f"{ranks_text([first.rank])}{where} failed first, at step {step}: {_how(first)}",
                   evidence=evidence, remedy=_remedy(first), step=step, since=t0)


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
    """The one line of a failure's text that says its cause: the innermost exception's own line
    (a DataLoader worker's error wraps the original traceback; its last line is the cause)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) <= 1:
        return (lines[0] if lines else "")[:limit]
    raised = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
    return (raised[-1] if raised else lines[-1])[:limit]


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
    if s.worker_crashes:
        w = s.worker_crashes[0]
        who = f"worker {w.worker_id} " if w.worker_id is not None else "worker "
        return (f"its DataLoader {who}(pid {w.pid}) died of {w.signal or 'an unknown cause'}; "
                f"the rank then failed ({reason[:160] or 'no reason left'})")
    sig = s.exit_signal
    if sig in FATAL_SIGNALS:
        return f"died of {sig}" + (f" ({reason})" if reason else "")
    if sig == "SIGKILL" and s.exit_cause == "oom_kill":
        return "killed by the OOM killer: " + _memory_words(s)
    if sig == "SIGKILL":
        return "killed (SIGKILL) from outside the job; the kernel names no OOM kill (scheduler, person?)"
    if sig in ("SIGTERM", "SIGINT", "SIGHUP") or s.status == Status.TERMINATED:
        return f"stopped by {sig or 'SIGTERM'} from outside the job"
    if s.exit_cause == "node_lost":
        return f"its host {s.host} vanished (node agent and ranks unreachable, no exit status or last words)"
    if s.status == Status.LOST:
        return "vanished without last words or an exit status (killed by SIGKILL from outside?)"
    if reason:
        return reason
    if s.exit_code:
        return f"exited with code {s.exit_code}"
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
    return f"/dev/shm is full{size}: {who} could not hand over its batch ({cause_line(s.exit_reason, 160)})"


def _memory_words(s: RankState) -> str:
    rss = s.rss_bytes or s.memory_peak_bytes
    limit = (f"the cgroup limit {human_bytes(s.memory_limit_bytes)}" if s.memory_limit_bytes
             else "no cgroup limit")
    peak = f" (the cgroup peaked at {human_bytes(s.memory_peak_bytes)})" if s.memory_peak_bytes else ""
    return f"RSS {human_bytes(rss)} at its last sample, {limit}{peak}"


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
