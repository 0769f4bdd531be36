"""System rules: cpu_oversubscribed, shm_pressure, gpu_heterogeneous, version_mismatch.

These compare ranks on the same host (CPU, /dev/shm) or across the job (GPU model,
software versions): the environment problems behind catalog F1, F3 and F4.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ddptop.diagnosis.common import active, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding, Severity
from ddptop.diagnosis.memo import shared
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.textfmt import human_bytes


def _by_host(snapshot: JobSnapshot) -> dict[str, list[RankState]]:
    # cpu_oversubscribed and shm_pressure both group the active ranks by host: once per diagnosis.
    return shared("by_host", (snapshot,), (), lambda: _group_by_host(snapshot))


def _group_by_host(snapshot: JobSnapshot) -> dict[str, list[RankState]]:
    hosts: dict[str, list[RankState]] = defaultdict(list)
    for s in active(snapshot):
        hosts[s.host].append(s)
    return dict(sorted(hosts.items()))


def cpu_oversubscribed(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                       config: DiagnosisConfig) -> list[Finding]:
    """DataLoader workers of all local ranks outnumber the host's cores."""
    out: list[Finding] = []
    for host, states in _by_host(snapshot).items():
        cores = max((s.cpu_count or 0) for s in states)
        workers = sum(s.loader_workers for s in states)
        if not cores or not workers or workers <= cores:
            continue
        per_rank = Counter(s.loader_workers for s in states)
        local = len(states)
        if len(per_rank) == 1:
            each = states[0].loader_workers
            rule = f"num_workers {each} x {local} local ranks = {workers} > {cores} cores on {host}"
        else:
            each = max(per_rank)
            rule = f"DataLoader workers of {local} local ranks = {workers} > {cores} cores on {host}"
        # One core per rank for the training process itself, the rest shared by its workers.
        target = max(1, cores // local - 1)
        evidence = [rule]
        loads = [s.load_avg[0] for s in states if s.load_avg]
        if loads:
            evidence.append(f"load average {max(loads):.1f} on {cores} cores")
        remedy = (f"num_workers {each} -> {target} (keep num_workers x local ranks <= cores) and lower "
                  "prefetch_factor" if target < each else
                  "run fewer ranks per node or give the job more cores "
                  "(keep num_workers x local ranks <= cores)")
        out.append(Finding(
            kind="cpu_oversubscribed", severity="warning", ranks=sorted(s.rank for s in states),
            title=rule, evidence=evidence, remedy=remedy,
        ))
    return out


def shm_pressure(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                 config: DiagnosisConfig) -> list[Finding]:
    """/dev/shm nearly full, or too small for DataLoader workers / NCCL's shared-memory transport."""
    out: list[Finding] = []
    for host, states in _by_host(snapshot).items():
        known = [s for s in states if s.shm_total_bytes]
        if not known:
            continue
        total = max(s.shm_total_bytes or 0 for s in known)
        used = max(s.shm_used_bytes or 0 for s in known)
        workers = sum(s.loader_workers for s in states)
        nccl = any(s.backend == "nccl" for s in states)
        fraction = used / total if total else 0.0
        severity: Severity
        if fraction > config.shm_used_fraction:
            severity = "critical" if fraction > config.shm_critical_fraction else "warning"
            title = f"/dev/shm on {host} is {fraction:.0%} full ({human_bytes(used)} of {human_bytes(total)})"
        elif total < config.shm_min_total_bytes and (workers or nccl):
            severity = "warning"
            users = " and ".join(x for x in (f"{workers} DataLoader workers" if workers else "",
                                              "NCCL" if nccl else "") if x)
            title = (f"/dev/shm on {host} is only {human_bytes(total)} "
                     f"(< {human_bytes(config.shm_min_total_bytes)}) for {users}")
        else:
            continue  # most hosts: no words made for them (thousands of hosts at 32,768 ranks)
        ranks = sorted(s.rank for s in states)
        evidence = [f"/dev/shm on {host}: {human_bytes(used)} used of {human_bytes(total)} ({fraction:.0%})"]
        out.append(Finding(
            kind="shm_pressure", severity=severity, ranks=ranks, title=title, evidence=evidence,
            remedy=("enlarge /dev/shm (docker run --shm-size=8g, or a larger tmpfs mount); meanwhile "
                    "fewer DataLoader workers / smaller prefetch_factor use less of it"),
        ))
    return out


def gpu_heterogeneous(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                      config: DiagnosisConfig) -> list[Finding]:
    """Ranks on GPUs of a different model or compute capability."""
    kinds: dict[tuple[str, str], list[int]] = defaultdict(list)
    for s in snapshot.ranks:
        if s.gpu is not None and (s.gpu.name or s.gpu.compute_capability):
            kinds[(s.gpu.name, s.gpu.compute_capability)].append(s.rank)
    if len(kinds) < 2:
        return []
    major = max(kinds.items(), key=lambda kv: len(kv[1]))[0]
    odd = sorted(r for k, rs in kinds.items() if k != major for r in rs)
    evidence = [f"{ranks_text(rs)}: {name or '?'} (compute capability {cc or '?'})"
                for (name, cc), rs in sorted(kinds.items(), key=lambda kv: min(kv[1]))]
    return [Finding(
        kind="gpu_heterogeneous", severity="warning", ranks=odd,
        title=f"{ranks_text(odd)} on a different GPU: " + "; ".join(evidence),
        evidence=evidence,
        remedy=("run on identical GPUs (CUDA_VISIBLE_DEVICES / scheduler constraints); mixed compute "
                "capabilities need kernels built for each (TORCH_CUDA_ARCH_LIST) and often crash (SIGSEGV)"),
    )]


_VERSION_FIELDS = ("torch", "cuda", "nccl", "driver", "python", "ddptop")


def version_mismatch(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                     config: DiagnosisConfig) -> list[Finding]:
    """torch / CUDA / NCCL / driver / Python versions that differ across ranks."""
    first = snapshot.ranks[0].versions if snapshot.ranks else None
    if all(s.versions == first for s in snapshot.ranks):
        return []  # every rank the same stack (one C-level compare each): no field can differ
    evidence: list[str] = []
    odd: set[int] = set()
    names: list[str] = []
    for name in _VERSION_FIELDS:
        values: dict[str, list[int]] = defaultdict(list)
        for s in snapshot.ranks:
            value = getattr(s.versions, name)
            if value:
                values[str(value)].append(s.rank)
        if len(values) < 2:
            continue
        major = max(values.items(), key=lambda kv: len(kv[1]))[0]
        odd.update(r for v, rs in values.items() if v != major for r in rs)
        names.append(name)
        listed = ", ".join(f"{v} on {ranks_text(rs)}" for v, rs in sorted(values.items()))
        evidence.append(f"{name}: {listed}")
    if not evidence:
        return []
    return [Finding(
        kind="version_mismatch", severity="warning", ranks=sorted(odd),
        title=f"{'/'.join(names)} versions differ across ranks ({ranks_text(odd)} differ from the rest)",
        evidence=evidence,
        remedy="install the same torch/CUDA/NCCL build and driver on every node (one container image)",
    )]
