"""Findings of what the cluster said (launchers', schedulers' words: #54), and why no one is blamed.

:func:`cluster_findings` turns the claims of :mod:`ddptop.evidence.cluster_claims` into
findings: the process Open MPI or Horovod names as the first to exit non-zero is that rank's
failure, certain; tasks srun says ran out of memory are those ranks' ends where the tasks are
the ranks; a node SLURM says failed is the answer itself (a ``node_lost`` that names the host,
no rank). Consequences ("Horovod has been shut down ... caused by an exception on one of the
ranks"), a launcher stopping every worker, SLURM's own cancellations blame no one.

:func:`why_no_one` says, where no finding names a cause with certainty, what was recognised
and why nobody is blamed: a finding of severity info (``no_culprit``), so that a log that was
understood is told apart from one that was not read. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from ddptop.diagnosis.claims import Claim
from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.finding import Finding
from ddptop.diagnosis.story import blames

FIRST_EXIT_REMEDY = ("the launcher names the first process that exited non-zero: read that rank's own output "
                     "(mpirun --tag-output, horovodrun's [N]<stderr> lines) for its exception; the others "
                     "were stopped after it")
SLURM_OOM_REMEDY = ("SLURM's cgroup OOM handler killed them: ask for more memory (--mem, --mem-per-cpu), "
                    "load less per task, and read `sacct -j JOB --format=JobID,State,MaxRSS,ReqMem`")
NODE_FAILURE_REMEDY = ("the node itself failed (SLURM lost it): ask the cluster's admins or read "
                       "`scontrol show node NODE` (Reason=), resubmit excluding it (--exclude NODE); no rank "
                       "is at fault")
NO_CULPRIT_REMEDY = ("nothing to fix in one rank: act on what was recognised (the reasons above); each "
                     "rank's "
                     "own lines with their prefix (srun -l, mpirun --tag-output, torchrun --tee 3) would "
                     "tell more")

# Why a statement of each kind blames no one, said once per kind.
_WHY = {
    "consequence": "a message that says it is a consequence of another rank's exception names no culprit",
    "death_signal": "the launcher stopped every worker on a signal from outside the job",
    "launcher_kill": "the launcher killed every worker after one failed, without saying which",
    "slurm_cancelled": "SLURM ended the job or step itself (a cancel, a time limit, a preemption)",
    "slurm_launch_failed": "SLURM could not start the tasks: no rank ran",
    "gpu_oom": "a GPU ran out of memory in a worker no line gives a rank to",
    "slurm_oom": "SLURM's OOM handler killed processes, and no line names a task that is a rank",
    "slurm_node_failure": "a node failed: the host is the answer, not a rank",
    "srun_tasks": "srun says how its tasks ended, not why",
    "nccl_ras": "NCCL's RAS report lists the ranks that stand out of a communicator (ahead, behind or "
                "silent), not one that failed",
    "nccl_ras_ok": "NCCL's RAS report says every communicator is running without error",
    "launcher_exit": "accelerate's launcher says only how its workers ended (a consequence)",
    "ray_actor_died": "Ray's caller says an actor died: the words of the one left waiting, naming no rank",
    "ray_task_error": "Ray's caller says an actor it called died: a consequence, naming no rank",
    "ray_memory_kill": "Ray's memory monitor killed the newest task on a node short of memory: the node, not "
                       "a rank",
    "ray_worker_died": "Ray says a worker died, not which rank or why",
}


def cluster_findings(claims: Sequence[Claim]) -> list[Finding]:
    """The findings of the cluster's own statements among *claims* (see the module)."""
    out: list[Finding] = []
    first = [c for c in claims if c.kind == "first_exit"]
    if first:
        ranks = sorted({r for c in first for r in c.culprits})
        out.append(Finding(kind="rank_lost", severity="critical", ranks=ranks, certain=len(ranks) == 1,
                           title=f"{first[0].words} ({first[0].source}): the others were stopped after it",
                           evidence=_said(first), remedy=FIRST_EXIT_REMEDY))
    oom = [c for c in claims if c.kind == "slurm_oom"]
    ranked = [c for c in oom if c.culprits]
    if oom:
        ranks = sorted({r for c in ranked for r in c.culprits})
        lead = ranked[0] if ranked else oom[0]
        title = (f"{ranks_text(ranks)} killed for memory by SLURM: {lead.words} on {lead.place}" if ranks
                 else f"SLURM's OOM handler killed processes: {lead.words} ({lead.source}); no line says "
                      "which rank")
        out.append(Finding(kind="rank_lost", severity="critical" if ranks else "warning", ranks=ranks,
                           certain=bool(ranks), title=title, evidence=_said(oom), remedy=SLURM_OOM_REMEDY))
    failed = [c for c in claims if c.kind == "slurm_node_failure"]
    if failed:
        hosts = sorted({c.place for c in failed if c.place})
        out.append(Finding(kind="node_lost", severity="critical", ranks=[], certain=False,
                           title=f"node {', '.join(hosts[:4])} failed under the job ({failed[0].source}: "
                                 f"{failed[0].words})",
                           evidence=_said(failed), remedy=NODE_FAILURE_REMEDY))
    return out


def why_no_one(findings: Sequence[Finding], claims: Sequence[Claim]) -> Finding | None:
    """The info finding that says what was recognised and why no one is blamed, where *claims*
    (a log's statements) were read and no finding of *findings* names a cause with certainty."""
    if not claims or any(blames(f) for f in findings):
        return None
    kinds = list(dict.fromkeys(c.kind for c in claims))
    reasons = [_WHY[k] for k in kinds if k in _WHY]
    # Findings of other evidence (not these statements' own, already said above).
    others = [f for f in findings if f.at_least("warning") and not any(c.words in f.title for c in claims)]
    if others:
        reasons.append(f"the other findings name no rank with certainty ({others[0].kind}: "
                       f"{others[0].title[:120]})")
    if not reasons:
        reasons.append("no statement read names a rank about itself")
    return Finding(kind="no_culprit", severity="info", ranks=[], certain=False,
                   title=f"recognised, no one blamed: {'; '.join(reasons[:3])}",
                   evidence=_said(list(claims)) + [f"why: {r}" for r in reasons], remedy=NO_CULPRIT_REMEDY)


def _said(claims: Sequence[Claim], limit: int = 8) -> list[str]:
    out = [f"{c.source}: {c.words}" + (f" ({c.place})" if c.place and c.place not in c.words else "")
           for c in claims[:limit]]
    return list(dict.fromkeys(out))
