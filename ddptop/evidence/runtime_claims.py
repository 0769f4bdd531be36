"""NCCL's RAS report, accelerate's launcher and Ray's workers, in their own words, as :class:`Claim`
records (#54, second part). Each shape is a real line of tests/data/logs_heldout/tune4:

* NCCL's RAS report (``ncclras``, or ``echo STATUS | nc localhost 28028``): the communicators' table
  (``Status  Errors``: ``RUNNING OK``, ``MISMATCH``, ``INCOMPLETE``) and the ranks it lists (``Rank N --
  GPU G managed by process P on node H``). RAS lists the ranks that stand out of a communicator:
  under ``MISMATCH`` those whose operation count differs from the others', ahead or behind (nccl#1911:
  the two listed were *not* the stragglers); under ``INCOMPLETE`` those it has no data from (a dead or
  unreachable process, or RAS's own fault: nccl#1762). Neither says a rank failed: no culprit, ever;
  a node it names is a place;
* accelerate's launcher: ``simple_launcher`` raising ``subprocess.CalledProcessError: Command [...]
  returned non-zero exit status N`` says only that its child ended so (a consequence); an
  ``accelerate`` traceback around torch.distributed.run's agent is the launcher stopping with its
  workers;
* Ray: ``ray.exceptions.ActorDiedError`` ("The actor died unexpectedly", its ``class_name`` / ``pid`` /
  ``ip`` lines) and ``RayTaskError(ActorDiedError): ray::Class.method() (pid=P, ip=IP, ...)`` are the
  caller's words about another process (consequences); Ray's memory monitor ("Ray killed this worker
  ... because it was the most recently scheduled task") names the node whose memory ran out, not a rank
  (it kills the newest task, not the one that used the memory); a worker's unranked ``CUDA Error: out of
  memory`` names no rank either.

Pure: lines in, claims out.
"""

from __future__ import annotations

import re

from ddptop.diagnosis.claims import NAMES_PLACE, TELLS_EXIT, Claim
from ddptop.evidence.log_lines import LogLine

ACTOR_LOOKAHEAD = 6  # lines after "The actor died unexpectedly" that may name its class, pid and ip

_RAS_ROW = re.compile(r"^\s{0,8}\d{1,4}(?:\s{1,12}\d{1,9}){5}\s{1,12}([A-Z]{2,16})\s{1,12}"
                      r"([A-Z,]{2,80})\s*$")
_RAS_RANK = re.compile(r"^\s{0,8}Rank (\d{1,7}) -- GPU (\d{1,3}) managed by process (\d{1,9}) "
                       r"on node (\S{1,80})")
_RAS_COUNTS = re.compile(r"Communicator ranks have different (\w{1,40}) operation counts")
_RAS_MISSING = re.compile(r"Missing communicator data from (\d{1,7}) (?:ranks?|job process(?:es)?)")
_CALLED = re.compile(r"^subprocess\.CalledProcessError: Command .{0,4000} returned non-zero exit status "
                     r"(-?\d{1,4})")
_ACCELERATE = re.compile(r"accelerate[/.]commands[/.](?:launch|accelerate_cli)|/bin/accelerate\b")
_ACTOR_DIED = re.compile(r"ray\.exceptions\.ActorDiedError: The actor died unexpectedly")
_ACTOR_FIELD = re.compile(r"^\s{0,8}(class_name|pid|ip): (\S{1,120})")
_TASK_ERROR = re.compile(r"ray\.exceptions\.RayTaskError\((\w{1,60})\): ray::([\w.<>]{1,120})\(\) "
                         r"\(pid=(\d{1,9}), ip=([\w.:-]{1,80})")
_MEMORY_KILL = re.compile(r"Memory on the node \(IP: ([\w.:-]{1,80}),.{0,200}?name=([\w.]{1,120}), "
                          r"pid=(\d{1,9}), memory used=([\d.]{1,12}\w{0,3})\).{0,80}? was "
                          r"([\d.]{1,12}\w{0,3} / [\d.]{1,12}\w{0,3}).{0,400}?Ray killed this worker")
_WORKER_DIED = re.compile(r"A worker died or was killed while executing (?:a )?task")
_CUDA_ERROR_OOM = re.compile(r"CUDA [Ee]rror: out of memory")


def runtime_claims(lines: list[LogLine]) -> list[Claim]:
    """The claims of NCCL's RAS report, accelerate's launcher and Ray in *lines* (see the module)."""
    out: list[Claim] = []
    ras = _ras(lines)
    if ras is not None:
        out.append(ras)
    accelerate = any(_ACCELERATE.search(ln.text) for ln in lines)
    for index, line in enumerate(lines):
        text = line.text.strip()
        claim: Claim | None = None
        if text.startswith("subprocess.CalledProcessError") and accelerate and (m := _CALLED.match(text)):
            claim = Claim(kind="launcher_exit", strength=TELLS_EXIT, source="accelerate's launcher",
                          words=f"its child process returned non-zero exit status {m.group(1)}")
        elif "ActorDiedError" in text and (m := _TASK_ERROR.search(text)):
            claim = Claim(kind="ray_task_error", strength=TELLS_EXIT, place=m.group(4),
                          words=f"ray::{m.group(2)}() (pid {m.group(3)}) failed with {m.group(1)}: "
                                "an actor it called died", source="Ray's caller")
        elif "ActorDiedError" in text and _ACTOR_DIED.search(text):
            claim = _actor_died(lines[index + 1:index + 1 + ACTOR_LOOKAHEAD])
        elif "Ray killed this worker" in text and (m := _MEMORY_KILL.search(text)):
            claim = Claim(kind="ray_memory_kill", strength=NAMES_PLACE, place=f"node {m.group(1)}",
                          words=f"Ray's memory monitor killed the worker of {m.group(2)} (pid {m.group(3)}, "
                                f"{m.group(4)}): the node's memory was at {m.group(5)}",
                          source="Ray's memory monitor")
        elif "A worker died" in text and _WORKER_DIED.search(text):
            claim = Claim(kind="ray_worker_died", strength=TELLS_EXIT, source="Ray",
                          words="a worker died or was killed while executing a task")
        elif "out of memory" in text and line.rank is None and _CUDA_ERROR_OOM.search(text):
            where = f" on {line.host}" if line.host else ""
            claim = Claim(kind="gpu_oom", strength=NAMES_PLACE, place=line.host,
                          words=f"CUDA error: out of memory{where}", source="a worker")
        if claim is not None and claim not in out:
            out.append(claim)
    if accelerate and not any(c.kind == "launcher_exit" for c in out) and \
            any("ChildFailedError" in ln.text or "failed (exitcode:" in ln.text for ln in lines):
        out.append(Claim(kind="launcher_exit", strength=TELLS_EXIT, source="accelerate's launcher",
                         words="it stopped with its workers (torch.distributed.run's agent under it)"))
    return out


def _ras(lines: list[LogLine]) -> Claim | None:
    """One claim for NCCL's RAS report: its communicators' statuses and the ranks it lists."""
    if not any(ln.text.startswith("Communicators...") for ln in lines):
        return None
    errors: list[str] = []
    listed: list[str] = []
    ranks: list[int] = []
    nodes: list[str] = []
    said: list[str] = []
    for line in lines:
        if (m := _RAS_ROW.match(line.text)) is not None:
            errors += [e for e in m.group(2).split(",") if e not in errors]
        elif (m := _RAS_RANK.match(line.text)) is not None:
            ranks.append(int(m.group(1)))
            listed.append(f"rank {m.group(1)} (GPU {m.group(2)}, process {m.group(3)} on {m.group(4)})")
            nodes.append(m.group(4))
        elif (m := _RAS_COUNTS.search(line.text)) or (m := _RAS_MISSING.search(line.text)):
            said.append(m.group(0))
    if not errors:
        return None
    status = ", ".join(errors)
    words = f"communicators {status}" + (f"; {'; '.join(dict.fromkeys(said))}" if said else "")
    if listed:
        words += f"; it lists {', '.join(listed[:4])}" + (" and more" if len(listed) > 4 else "")
    return Claim(kind="nccl_ras" if errors != ["OK"] else "nccl_ras_ok", strength=NAMES_PLACE,
                 named=sorted(set(ranks))[:64], place=", ".join(dict.fromkeys(nodes[:4])), words=words,
                 source="NCCL's RAS report")


def _actor_died(after: list[LogLine]) -> Claim:
    fields: dict[str, str] = {}
    for line in after:
        if (m := _ACTOR_FIELD.match(line.text)) is not None:
            fields.setdefault(m.group(1), m.group(2))
    actor = fields.get("class_name", "an actor")
    pid = f" (pid {fields['pid']})" if "pid" in fields else ""
    return Claim(kind="ray_actor_died", strength=TELLS_EXIT, place=fields.get("ip", ""),
                 words=f"{actor}{pid} died unexpectedly before finishing its task", source="Ray's caller")
