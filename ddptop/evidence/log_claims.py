"""The statements of a log that name a culprit or a place, read as :class:`Claim` records.

Each shape is a real line (tests/data/logs_heldout, tests/data/logs): PyTorch's monitored
barrier, a watchdog or a rank's exception carrying a CUDA error, NCCL's own
``host:pid:tid [dev] ... NCCL WARN`` lines (a ``Cuda failure``, a peer's address, a
duplicate GPU), the kernel's OOM killer and Xid lines, srun's ``task N: Exited ...``.
A rank is given to a claim only where the line proves it (a launcher prefix, the default
group's ``[Rank N]``, the statement's own words); else the claim names its place (host,
process, GPU, address). :func:`recognised` says in one line what the file held. Pure.
"""

from __future__ import annotations

import re
from collections import Counter

from ddptop.diagnosis.claims import NAMES_CULPRIT, NAMES_PLACE, NAMES_SETUP, TELLS_EXIT, Claim
from ddptop.evidence.cluster_claims import cluster_claims
from ddptop.evidence.log_lines import LogLine, unglued

MAX_CLAIMS = 256  # per file: a thousand ranks' identical lines tell no more than the first ones
MAX_WORDS = 200

_BARRIER = re.compile(r"Rank (\d{1,7}) successfully reached monitoredBarrier, but received errors while "
                      r"waiting "
                      r"for send/recv from rank (\d{1,7})")
_BARRIER_ZERO = re.compile(r"\[Rank (\d{1,7})\]: Ranks? ([\d, ]{1,400}?) failed to pass monitoredBarrier")
_WATCHDOG_CUDA = re.compile(r"\[(?:PG (?:ID )?(\d{1,6})[^\]]{0,80}?)?Rank (\d{1,7})\] "
                            r"(?:NCCL|Process group) watchdog "
                            r"thread terminated with exception: (CUDA error: [^.\n]{1,160})")
_RAISED_CUDA = re.compile(r"^(?:[\w.]{1,80}Error|c10::\w{1,40}): (CUDA error: [^.\n]{1,160})")
_NCCL_PROCESS = re.compile(r"^(\S{1,80}?):(\d{1,9}):\d{1,9} \[(\d{1,3})\] "
                           r"(?:\S{1,80}:\d{1,6} )?NCCL (?:WARN|INFO) ")
_NCCL_CUDA = re.compile(r"NCCL WARN Cuda failure '([^']{1,80})'")
_PEER = re.compile(r"(Got completion from peer|Connection closed by (?:remote )?peer|Call to recv from|"
                   r"Call to connect to|Connection reset by peer)\s?:?\s?"
                   r"([\w.:<>\[\]-]{3,120}[>\]](?::\d{1,5})?)")
_PEER_STATUS = re.compile(r"with (?:status=|error )(\d{1,4})")
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected : rank (\d{1,7}) and rank (\d{1,7}) both on CUDA "
                            r"device (\w{1,16})")
_OOM_KILLER = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d{1,9}) "
                         r"\(([^)]{1,40})\)"
                         r"|oom-kill:.{0,300}?task=([^,]{1,40}),pid=(\d{1,9})")
_XID = re.compile(r"NVRM: Xid \((PCI:[0-9a-fA-F:.]{4,20})\): (\d{1,4})(?:, pid=(\d{1,9}))?")
_SRUN = re.compile(r"^srun: error: (\S{1,80}): tasks? ([\d,\-]{1,80}): (Exited with exit code \d{1,4}|Killed|"
                   r"Terminated|Segmentation fault|Aborted|Bus error)")


def claims_of(lines: list[LogLine], default_group_only: bool = True) -> list[Claim]:
    """Every claim of *lines*, in the file's order (capped). *default_group_only*: no line
    names a process group other than the default one (a bare ``[Rank N]`` is then global)."""
    out: list[Claim] = []
    for line in lines:
        if len(out) >= MAX_CLAIMS:
            break
        text = unglued(line.text) if "monitoredBarrier" in line.text or "watchdog" in line.text else line.text
        claim = _claim(text, line.rank, line.host, default_group_only)
        if claim is not None and claim not in out:
            out.append(claim)
    return out + cluster_claims(lines)  # the launcher's and scheduler's own words (#54)


def _claim(text: str, rank: int | None, host: str, default_only: bool) -> Claim | None:
    if "monitoredBarrier" in text:
        return _barrier(text)
    if "CUDA error: " in text:
        return _cuda(text, rank, host, default_only)
    if " NCCL WARN " in text and (m := _NCCL_PROCESS.match(text)):
        return _nccl(text, m, rank)
    if "peer" in text or "Call to " in text:
        return _peer(text, rank, host)
    if "Killed process" in text or "oom-kill" in text:
        return _oom(text)
    if "Xid" in text and (m := _XID.search(text)):
        return Claim(kind="xid", strength=NAMES_CULPRIT, place=f"{host or 'a GPU'} at {m.group(1)}",
                     words=f"Xid {m.group(2)}", source="the NVIDIA driver (kernel log)")
    if text.startswith("srun: error: ") and (m := _SRUN.match(text)):
        return Claim(kind="srun_tasks", strength=TELLS_EXIT, place=m.group(1),
                     words=f"task(s) {m.group(2)}: {m.group(3)}", source="srun")
    return None


def _barrier(text: str) -> Claim | None:
    if m := _BARRIER.search(text):
        reporter, culprit = int(m.group(1)), int(m.group(2))
        return Claim(kind="monitored_barrier", strength=NAMES_CULPRIT, culprits=[culprit], victims=[reporter],
                     words=f"rank {reporter} reached it, no answer from rank {culprit}",
                     source=f"PyTorch's monitored barrier (printed by rank {reporter})")
    if m := _BARRIER_ZERO.search(text):
        culprits = sorted({int(r) for r in re.findall(r"\d{1,7}", m.group(2))})
        return Claim(kind="monitored_barrier", strength=NAMES_CULPRIT, culprits=culprits,
                     victims=[int(m.group(1))], words=f"ranks {culprits} failed to pass it",
                     source=f"PyTorch's monitored barrier (printed by rank {m.group(1)})")
    return None


def _cuda(text: str, rank: int | None, host: str, default_only: bool) -> Claim | None:
    m = _WATCHDOG_CUDA.search(text)
    if m is not None:
        group, said, error = m.group(1), int(m.group(2)), m.group(3).strip()
        # [Rank N] is global in the default group (PG 0), or where no line names another group.
        default = group in (None, "0") and bool(group or default_only)
        own = rank if rank is not None else (said if default else None)
        source = f"rank {own}'s NCCL watchdog" if own is not None else "an NCCL watchdog"
        return _own("cuda_error", own, host, error, source)
    raised = _RAISED_CUDA.match(text.strip())
    if raised is None:
        return None
    source = f"rank {rank}'s exception" if rank is not None else "an exception"
    return _own("cuda_error", rank, host, raised.group(1).strip(), source)


def _own(kind: str, rank: int | None, place: str, words: str, source: str) -> Claim:
    return Claim(kind=kind, strength=NAMES_CULPRIT, culprits=[rank] if rank is not None else [],
                 place=place, words=words[:MAX_WORDS], source=source)


def _nccl(text: str, m: re.Match[str], rank: int | None) -> Claim | None:
    process = f"{m.group(1)} pid {m.group(2)} GPU {m.group(3)}"
    if cuda := _NCCL_CUDA.search(text):
        return _own("nccl_cuda_failure", rank, process, f"NCCL: Cuda failure '{cuda.group(1)}'",
                    f"NCCL in rank {rank}" if rank is not None else f"NCCL in {process}")
    if dup := _DUPLICATE_GPU.search(text):
        pair = sorted({int(dup.group(1)), int(dup.group(2))})
        return Claim(kind="setup", strength=NAMES_SETUP, named=pair, place=process,
                     words=f"ranks {pair[0]} and {pair[1]} were given one GPU (CUDA device {dup.group(3)})",
                     source="NCCL")
    return _peer(text[m.end():], rank, process)


def _peer(text: str, rank: int | None, place: str) -> Claim | None:
    m = _PEER.search(text)
    if m is None:
        return None
    address = m.group(2)
    if address.endswith(">") and "<" in address:  # NCCL writes host<port>
        host, _, port = address[:-1].rpartition("<")
        address = f"{host}:{port}"
    address = address.lstrip("[").replace("]:", ":").rstrip("]")
    status = _PEER_STATUS.search(text)
    words = f"{m.group(1)} {address}" + (f" (status {status.group(1)})" if status else "")
    return Claim(kind="peer_address", strength=NAMES_PLACE, victims=[rank] if rank is not None else [],
                 place=address, words=words[:MAX_WORDS],
                 source=_peer_source(text, rank, place))


def _peer_source(text: str, rank: int | None, place: str) -> str:
    """Who lost the peer, by how the address is written: NCCL writes ``host<port>`` (its own
    WARN lines, or an NCCL error's "Last error:"), gloo ``[addr]:port``."""
    nccl = place or "NCCL" in text or re.search(r"[\w.-]<\d{1,5}>", text) is not None
    who = "NCCL" if nccl else "gloo"
    return f"{who} in rank {rank}" if rank is not None else (f"{who} in {place}" if place else who)


def _oom(text: str) -> Claim | None:
    m = _OOM_KILLER.search(text)
    if m is None:
        return None
    pid, name = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
    return Claim(kind="oom_killer", strength=NAMES_CULPRIT, place=f"pid {pid}",
                 words=f"the kernel's OOM killer killed pid {pid} ({name})", source="the kernel (dmesg)")


def recognised(lines: list[LogLine], claims: list[Claim], tracebacks: dict[int, list[str]],
               read: list[str], summary_entries: int = 0) -> str:
    """What the file held, in one line: "34 lines: 3 srun task exits, 1 Python traceback of rank 5"."""
    parts = list(read)
    if summary_entries:
        entries = "entry" if summary_entries == 1 else "entries"
        parts.append(f"{summary_entries} {entries} of torchrun's failure summary")
    kinds = Counter(c.kind for c in claims)
    words = {"monitored_barrier": "monitored-barrier report", "cuda_error": "CUDA error",
             "nccl_cuda_failure": "NCCL Cuda failure", "oom_killer": "OOM-killer line", "xid": "Xid line",
             "peer_address": "lost-peer line", "setup": "NCCL set-up error",
             "srun_tasks": "srun task exit", "slurm_oom": "SLURM OOM-kill line", "slurm_cancelled":
             "SLURM cancellation", "slurm_node_failure": "SLURM node failure", "slurm_launch_failed":
             "SLURM task-launch failure", "first_exit": "launcher's first-failed-process statement",
             "consequence": "consequence-only message", "death_signal": "launcher death-signal line",
             "launcher_kill": "launcher kill statement", "gpu_oom": "unranked CUDA out-of-memory error",
             "nccl_ras": "NCCL RAS report", "nccl_ras_ok": "NCCL RAS report",
             "launcher_exit": "accelerate launcher exit", "ray_actor_died": "Ray actor-died error",
             "ray_task_error": "Ray task error", "ray_memory_kill": "Ray memory-monitor kill",
             "ray_worker_died": "Ray worker-died line"}
    parts += [f"{n} {words.get(k, k)}(s)" for k, n in sorted(kinds.items())]
    if tracebacks:
        ranks = sorted(tracebacks)
        parts.append(f"{len(ranks)} Python traceback(s) of rank {', '.join(map(str, ranks[:8]))}")
    bare = sum(1 for ln in lines if ln.rank is None and ln.text.startswith("Traceback (most recent call"))
    if bare:
        parts.append(f"{bare} Python traceback(s) no line gives a rank to")
    nccl = sum(1 for ln in lines if " NCCL WARN " in ln.text)
    if nccl:
        parts.append(f"{nccl} NCCL WARN line(s)")
    prefixed = len({ln.rank for ln in lines if ln.rank is not None})
    if prefixed:
        parts.append(f"lines of {prefixed} rank(s) by their prefix")
    count = f"{len(lines)} line{'' if len(lines) == 1 else 's'}"
    return f"{count}: " + (", ".join(parts) if parts else "nothing a rule reads")
