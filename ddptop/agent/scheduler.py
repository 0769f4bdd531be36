"""The scheduler's word on a rank stopped by a signal: was it SLURM (#22 item 3)?

``scancel``, a time limit, preemption and a failed node all reach a rank as SIGTERM (then
SIGKILL after SLURM's ``KillWait``), exactly like a person's ``kill``. SLURM knows which: its
controller keeps the job's state (``CANCELLED``, ``TIMEOUT``, ``PREEMPTED``, ``NODE_FAIL``,
``DEADLINE``) for ``MinJobAge`` seconds after the job ended. The node agent notes each rank's
SLURM job while the rank lives (its ``/proc/PID/environ``: a zombie's is empty) and, when a
rank dies of SIGTERM, SIGKILL or SIGINT, asks ``scontrol show job`` once per job (bounded in
time: a few seconds while the job still reads COMPLETING; nothing when SLURM is not there).
A rank killed by a person while the job runs reads RUNNING: no verdict, as it should be.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time

log = logging.getLogger(__name__)

SCONTROL_TIMEOUT_S = 5.0
SETTLE_S = 4.0  # how long a COMPLETING or RUNNING job may take to show why it ended
ASKED_AT_SIGNALS = frozenset(("SIGTERM", "SIGKILL", "SIGINT", ""))  # "": unread (torchrun reaped it first)
# SLURM's job states that stop a job from outside, as RankExit.cause words.
# "slurm_stopped": the job was ending (COMPLETING) and could not be told apart further.
CAUSES = {"CANCELLED": "slurm_cancelled", "TIMEOUT": "slurm_timeout", "PREEMPTED": "slurm_preempted",
          "NODE_FAIL": "slurm_node_fail", "DEADLINE": "slurm_deadline"}
_FIELD = re.compile(r"\b(JobState|RunTime|TimeLimit)=(\S{1,40})")
_DURATION = re.compile(r"(?:(\d{1,5})-)?(?:(\d{1,2}):)?(\d{1,2}):(\d{1,2})")
_JOB = re.compile(r"\d{1,12}(_\d{1,9})?")


class SchedulerWatch:
    """Each watched rank's SLURM job, and the scheduler's verdict per job (asked once)."""

    def __init__(self, scontrol: str | None = None) -> None:
        self._scontrol = scontrol if scontrol is not None else (shutil.which("scontrol") or "")
        self._jobs: dict[int, tuple[int, str]] = {}  # rank -> (pid, SLURM job id)
        self._verdicts: dict[str, str] = {}
        self._in_step = bool(os.environ.get("SLURM_STEP_ID"))  # this agent is itself a task of a job

    def watch(self, rank: int, pid: int, environ: dict[str, str]) -> None:
        """Note *rank*'s SLURM job, from its environment (read while it lives)."""
        job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or ""
        if _JOB.fullmatch(job):
            self._jobs[rank] = (pid, job)

    def verdict(self, rank: int, pid: int, signal: str) -> str:
        """``slurm_cancelled``, ``slurm_timeout``... when SLURM stopped the job *rank* ran in."""
        seen_pid, job = self._jobs.get(rank, (0, ""))
        if signal not in ASKED_AT_SIGNALS or not job or seen_pid != pid or not self._scontrol:
            return ""
        if job not in self._verdicts:
            self._verdicts[job] = self._ask(job)
        return self._verdicts[job]

    def _ask(self, job: str) -> str:
        # A job being cancelled reads COMPLETING (or still RUNNING) until every process of its
        # steps ended: ask again for a few seconds, once per job, at its end. An agent that is
        # itself a task of the job (`srun ... ddptop launch -- torchrun`) keeps it COMPLETING
        # while it waits: it decides at once, from the job's run time against its limit.
        deadline = time.monotonic() + SETTLE_S
        while True:
            fields = self._show(job)
            state = fields.get("JobState", "")
            settled = state not in ("COMPLETING", "RUNNING") or (state == "COMPLETING" and self._in_step)
            if settled or time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        if state == "COMPLETING":
            limit = _seconds(fields.get("TimeLimit", ""))
            ran = _seconds(fields.get("RunTime", ""))
            return "slurm_timeout" if limit and ran >= limit else "slurm_stopped"
        return CAUSES.get(state, "")

    def _show(self, job: str) -> dict[str, str]:
        try:
            res = subprocess.run([self._scontrol, "show", "job", "-o", job], capture_output=True, text=True,
                                 timeout=SCONTROL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("scontrol show job %s: %s", job, exc)
            return {}
        return dict(_FIELD.findall(res.stdout[:65536]))


def _seconds(text: str) -> int:
    """SLURM's [days-]hours:minutes:seconds as seconds (0 for UNLIMITED or unreadable)."""
    found = _DURATION.fullmatch(text)
    if not found:
        return 0
    days, hours, minutes, seconds = (int(g) if g else 0 for g in found.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
