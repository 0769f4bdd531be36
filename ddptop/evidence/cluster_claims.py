"""What the cluster says in a log, in its own words, read as :class:`Claim` records (#54).

The launcher's and the scheduler's lines, not PyTorch's (each shape a real line of
tests/data/logs_heldout/tune3):

* SLURM: ``srun: error: NODE: tasks 1-3: Out Of Memory``, ``slurmstepd: error: Detected 1
  oom_kill event in StepId=J.S``, ``*** JOB J ON NODE CANCELLED AT T [DUE TO TIME LIMIT |
  NODE FAILURE | PREEMPTION] ***``, ``srun: error: Node failure on NODE``, ``srun: error:
  Task launch for J.S failed on node N: ...``. A task id is a rank only where the launch
  makes them equal: srun starting the ranks itself, not srun starting torchrun, accelerate or
  deepspeed per node (then a task is a node's launcher);
* Open MPI's abort block and Horovod's launcher: "The first process to do so was: Process
  name: [[J,1],N] / Exit code: C" (Open MPI's vpid N of the application is rank N; Horovod's
  process name is the rank);
* statements that say they are consequences: Horovod's "has been shut down. This was caused
  by an exception on one of the ranks" names no one, never its own rank;
* launchers stopping every worker: torchrun's agent "Received 1 death signal, shutting down
  workers", DeepSpeed's "Killing subprocess N";
* a worker's CUDA out-of-memory error naming its GPU, where no line gives its rank (a vLLM
  worker's ``(VllmWorkerProcess pid=P)``);
* NCCL's RAS report, accelerate's launcher and Ray's workers: :mod:`ddptop.evidence.runtime_claims`.

Pure: lines in, claims out.
"""

from __future__ import annotations

import re
import signal

from ddptop.diagnosis.claims import NAMES_CULPRIT, NAMES_PLACE, TELLS_EXIT, Claim
from ddptop.evidence.log_lines import LogLine
from ddptop.evidence.runtime_claims import runtime_claims

MAX_CLUSTER_CLAIMS = 64
FIRST_PROCESS_LOOKAHEAD = 8  # lines after "The first process to do so was:" that may name it

_SRUN_OOM = re.compile(r"^srun: error: (\S{1,80}): tasks? ([\d,\-]{1,80}): Out Of Memory")
_STEP_OOM = re.compile(r"slurmstepd: error: Detected (\d{1,6}) oom[-_]kill events?(?:\(s\))? in "
                       r"(?:StepId=|step )([\w.]{1,40})")
# "*** JOB J ON NODE CANCELLED AT T ... ***"; SLURM before 17.02 put the node after: "... *** on NODE".
_CANCELLED = re.compile(r"\*\*\* (JOB|STEP) ([\w.]{1,40}) (?:ON (\S{1,80}) )?CANCELLED AT (\S{1,40})"
                        r"(?: DUE TO ([A-Z ]{1,40}?))? \*\*\*(?: on (\S{1,80}))?")
_NODE_FAILURE = re.compile(r"^s(?:run|alloc|batch): error: Node failure on (\S{1,80})")
_LAUNCH_FAILED = re.compile(r"^srun: error: Task launch for ([\w.]{1,40}) failed on node (\S{1,80}): "
                            r"(.{1,120})")
_FIRST = re.compile(r"The first process to do so was:?")
_PROCESS = re.compile(r"Process name: (?:\[\[\d{1,9},\d{1,6}\],(\d{1,7})\]|(\d{1,7})\b)")
_EXIT_CODE = re.compile(r"Exit code:\s{0,8}(-?\d{1,4})")
_HOROVOD_SHUTDOWN = re.compile(r"Horovod has been shut down\. This (?:was|has been) caused by an exception "
                               r"on one of the ranks?")
_DEATH_SIGNAL = re.compile(r"Received (?:Signals\.)?(SIG[A-Z]{2,8}|\d{1,2}) death signal, "
                           r"shutting down workers")
_DS_KILL = re.compile(r"\[launch\.py:\d{1,5}:sigkill_handler\] Killing subprocess (\d{1,9})")
_GPU_OOM = re.compile(r"OutOfMemoryError: CUDA out of memory\. Tried to allocate [\d.]{1,12} [KMGT]?i?B\. "
                      r"GPU (\d{1,3})")
_WORKER_PID = re.compile(r"\((?:\w{1,40}Worker\w{0,20}|\w{1,40}Actor\w{0,20}) pid=(\d{1,9})\)")
# Lines of a launcher started once per node: srun's tasks are then those launchers, not ranks.
_PER_NODE_LAUNCHER = re.compile(r"torch\.distributed\.(?:elastic|run|launch)|"
                                r"torch/distributed/(?:elastic|run)|"
                                r"torchrun|launch\.py:\d{1,5}:|accelerate[ /.]|deepspeed\.launcher")


def cluster_claims(lines: list[LogLine]) -> list[Claim]:
    """The claims of the launcher's and scheduler's own lines in *lines* (see the module)."""
    tasks_are_ranks = not any(_PER_NODE_LAUNCHER.search(ln.text) for ln in lines)
    out: list[Claim] = []
    killed = 0
    for index, line in enumerate(lines):
        if len(out) >= MAX_CLUSTER_CLAIMS:
            break
        text = line.text.strip()
        claim = _slurm(text, tasks_are_ranks) if ("srun" in text or "slurm" in text or "***" in text
                                                  or "salloc" in text) else None
        if claim is None and _FIRST.search(text):
            claim = _first_process(text, lines[index + 1:index + 1 + FIRST_PROCESS_LOOKAHEAD])
        if claim is None and "Horovod has been shut down" in text and _HOROVOD_SHUTDOWN.search(text):
            claim = Claim(kind="consequence", strength=TELLS_EXIT, victims=_own(line),
                          words="Horovod has been shut down, caused by an exception on one of the ranks",
                          source=_who(line, "Horovod"))
        if claim is None and "death signal" in text and (m := _DEATH_SIGNAL.search(text)):
            claim = Claim(kind="death_signal", strength=TELLS_EXIT, words=_signal_name(m.group(1)),
                          source="torchrun's agent")
        if claim is None and "Killing subprocess" in text and _DS_KILL.search(text):
            killed += 1
            continue
        if claim is None and "OutOfMemoryError" in text and line.rank is None and \
                (m := _GPU_OOM.search(text)):
            worker = _WORKER_PID.search(line.text)
            claim = Claim(kind="gpu_oom", strength=NAMES_PLACE, place=f"GPU {m.group(1)}",
                          words=f"CUDA out of memory on GPU {m.group(1)}",
                          source=f"worker pid {worker.group(1)}" if worker else "a worker")
        if claim is not None and claim not in out:
            out.append(claim)
    if killed:
        out.append(Claim(kind="launcher_kill", strength=TELLS_EXIT, words=f"killed {killed} worker(s)",
                         source="DeepSpeed's launcher"))
    # NCCL's RAS report, accelerate's launcher, Ray's workers (ddptop.evidence.runtime_claims).
    out += [c for c in runtime_claims(lines) if c not in out][:max(0, MAX_CLUSTER_CLAIMS - len(out))]
    return out


def _slurm(text: str, tasks_are_ranks: bool) -> Claim | None:
    if m := _SRUN_OOM.match(text):
        tasks = _task_ids(m.group(2))
        return Claim(kind="slurm_oom", strength=NAMES_CULPRIT, culprits=tasks if tasks_are_ranks else [],
                     place=m.group(1), words=f"task(s) {m.group(2)}: Out Of Memory",
                     source="srun" if tasks_are_ranks else
                     "srun (its tasks are per-node launchers, not ranks)")
    if m := _STEP_OOM.search(text):
        step = m.group(2).rstrip(".")  # the sentence's full stop is not the step's
        return Claim(kind="slurm_oom", strength=NAMES_PLACE, place=f"step {step}",
                     words=f"{m.group(1)} OOM kill event(s) in step {step}", source="slurmstepd")
    if m := _CANCELLED.search(text):
        why = (m.group(5) or "").strip().lower()
        kind = "slurm_node_failure" if why == "node failure" else "slurm_cancelled"
        return Claim(kind=kind, strength=NAMES_PLACE if kind == "slurm_node_failure" else TELLS_EXIT,
                     place=m.group(3) or m.group(6) or "",
                     words=f"{m.group(1).lower()} {m.group(2)} cancelled at {m.group(4)}"
                     + (f" due to {why}" if why else ""), source="slurmstepd")
    if m := _NODE_FAILURE.match(text):
        return Claim(kind="slurm_node_failure", strength=NAMES_PLACE, place=m.group(1),
                     words=f"node failure on {m.group(1)}", source=text.split(":", 1)[0])
    if m := _LAUNCH_FAILED.match(text):
        return Claim(kind="slurm_launch_failed", strength=TELLS_EXIT, place=m.group(2),
                     words=f"task launch for step {m.group(1)} failed on {m.group(2)}: {m.group(3).strip()}",
                     source="srun")
    return None


def _first_process(text: str, after: list[LogLine]) -> Claim | None:
    """Open MPI's or Horovod's "The first process to do so was:" and the lines naming it."""
    rank: int | None = None
    code = ""
    for line in [LogLine(text, None), *after]:
        if rank is None and (m := _PROCESS.search(line.text)):
            rank = int(m.group(1) or m.group(2))
        if not code and (c := _EXIT_CODE.search(line.text)):
            code = c.group(1)
    if rank is None:
        return None
    horovod = "Horovod" in text
    return Claim(kind="first_exit", strength=NAMES_CULPRIT, culprits=[rank],
                 words=f"rank {rank} was the first process to exit non-zero"
                 + (f" (exit code {code})" if code else ""),
                 source="Horovod's launcher" if horovod else "Open MPI's mpirun")


def _task_ids(text: str) -> list[int]:
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            out.update(range(int(low), (int(high) if high else int(low)) + 1))
    return sorted(out)[:4096]


def _own(line: LogLine) -> list[int]:
    return [line.rank] if line.rank is not None else []


def _who(line: LogLine, what: str) -> str:
    return f"{what} in rank {line.rank}" if line.rank is not None else what


def _signal_name(said: str) -> str:
    if said.isdigit():
        try:
            said = signal.Signals(int(said)).name
        except ValueError:
            said = f"signal {said}"
    return f"received {said} and stopped every worker"
