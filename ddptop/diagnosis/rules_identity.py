"""Identity rules: param_mismatch, rng_divergence, rank_lost (catalog F1, F4, F5).

Ranks of one job must build the same model, draw the same data split, and stay alive;
these rules compare fingerprints across ranks and report ranks that left early.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from ddptop.diagnosis.common import ACTIVE, ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import ParamFingerprint, RankState, Sample

log = logging.getLogger(__name__)


def param_mismatch(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                   config: DiagnosisConfig) -> list[Finding]:
    """Ranks whose wrapped model has different parameter shapes; names the first difference."""
    hashes: dict[str, list[RankState]] = defaultdict(list)
    for s in snapshot.ranks:
        if s.param_fingerprint is not None:
            hashes[s.param_fingerprint.shapes_hash].append(s)
    if len(hashes) < 2:
        return []
    major = max(hashes.items(), key=lambda kv: (len(kv[1]), -min(s.rank for s in kv[1])))[0]
    ref = hashes[major][0].param_fingerprint
    assert ref is not None
    others = [s for h, states in hashes.items() if h != major for s in states]
    evidence: list[str] = []
    firsts: list[str] = []
    for s in sorted(others, key=lambda s: s.rank):
        fp = s.param_fingerprint
        assert fp is not None
        diff = first_difference(fp, ref)
        firsts.append(f"rank {s.rank}: {diff}")
        peers = ranks_text(r.rank for r in hashes[major])
        evidence.append(f"rank {s.rank}: {fp.count} tensors, {fp.numel} elements; "
                        f"{peers}: {ref.count} tensors, {ref.numel} elements")
    return [Finding(
        kind="param_mismatch", severity="critical", ranks=sorted(s.rank for s in others),
        title=firsts[0] if len(firsts) == 1 else "; ".join(firsts),
        evidence=firsts + evidence,
        remedy=("every rank must build the same model before DDP(...): look for rank-dependent config, "
                "vocabulary or speaker counts read from per-rank data (an empty list gives a 0-sized "
                "dimension), or a checkpoint loaded on some ranks only"),
    )]


def first_difference(fp: ParamFingerprint, ref: ParamFingerprint) -> str:
    """'embedding.weight is [0, 192], others [5994, 192]' for the first differing parameter."""
    mine, theirs = dict(fp.shapes), dict(ref.shapes)
    for name, shape in ref.shapes:
        if name not in mine:
            return f"has no {name} (others {list(shape)})"
        if list(mine[name]) != list(shape):
            return f"{name} is {list(mine[name])}, others {list(shape)}"
    for name, shape in fp.shapes:
        if name not in theirs:
            return f"has an extra {name} {list(shape)}"
    if fp.count != ref.count:
        return f"{fp.count} parameter tensors, others {ref.count}"
    if fp.numel != ref.numel:
        return f"{fp.numel} parameter elements, others {ref.numel}"
    return "parameter shapes differ (beyond the shapes listed)"


_RNG_SOURCES = ("numpy", "torch", "python")


def rng_divergence(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                   config: DiagnosisConfig) -> list[Finding]:
    """RNG fingerprints that differ across ranks at the same epoch (numpy/torch/python apart).

    Severity is info alone: many recipes seed each rank differently on purpose (augmentation).
    With unequal loader lengths it becomes the explanation, which unequal_batches cites.
    """
    by_epoch: dict[int, list[RankState]] = defaultdict(list)
    for s in snapshot.ranks:
        if s.rng_fingerprint is not None:
            by_epoch[s.rng_fingerprint.epoch].append(s)
    out: list[Finding] = []
    for epoch, states in sorted(by_epoch.items()):
        if len(states) < 2:
            continue
        evidence: list[str] = []
        sources: list[str] = []
        for source in _RNG_SOURCES:
            values: dict[str, list[int]] = defaultdict(list)
            for s in states:
                assert s.rng_fingerprint is not None
                value = getattr(s.rng_fingerprint, source)
                if value:
                    values[value].append(s.rank)
            if len(values) > 1:
                sources.append(source)
                evidence.append(f"{source}: {len(values)} distinct states at epoch {epoch} ("
                                + ", ".join(f"{ranks_text(rs)}: {v[:8]}" for v, rs in sorted(values.items()))
                                + ")")
        if not sources:
            continue
        remedy = ("seed every source alike on every rank: torch.manual_seed(s), np.random.seed(s), "
                  "random.seed(s), and train_test_split(..., seed=s)")
        if "numpy" in sources:
            remedy += "; numpy is not seeded by torch.manual_seed"
        out.append(Finding(
            kind="rng_divergence", severity="info", ranks=sorted(s.rank for s in states),
            title=f"{'/'.join(sources)} RNG state differs across ranks at epoch {epoch}: "
                  "random splits or shuffles drawn with it differ per rank",
            evidence=evidence, remedy=remedy,
        ))
    return out


def rank_lost(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
              config: DiagnosisConfig) -> list[Finding]:
    """Ranks that crashed, vanished or exited while their peers still run."""
    running = [s.rank for s in snapshot.ranks if s.status in ACTIVE]
    out: list[Finding] = []
    crashed = [s for s in snapshot.ranks if s.status == "crashed"]
    lost = [s for s in snapshot.ranks if s.status == "lost"]
    exited = [s for s in snapshot.ranks if s.status == "exited" and not s.exit_reason]
    crashed += [s for s in snapshot.ranks if s.status == "exited" and s.exit_reason]
    if crashed:
        order = sorted(crashed, key=lambda s: (_last_alive(s, histories), s.rank))
        first = order[0]
        evidence = [f"rank {s.rank} on {s.host} (pid {s.pid}): {s.exit_reason or 'died'}"
                    f", step {_last_step(s, histories)}"
                    + (f"; stack in {s.crash_file}" if s.crash_file else "")
                    for s in order]
        if len(order) > 1:
            evidence.append(f"rank {first.rank} was the first to go silent")
        if running:
            evidence.append(f"{ranks_text(running)} still running (they will hang in the next collective)")
        out.append(Finding(
            kind="rank_lost", severity="critical", ranks=[s.rank for s in order],
            title=f"{ranks_text(s.rank for s in order)} crashed: {first.exit_reason or 'no reason left'}",
            evidence=evidence,
            remedy=_crash_remedy(first),
        ))
    if lost and running:
        out.append(Finding(
            kind="rank_lost", severity="critical", ranks=[s.rank for s in lost],
            title=f"{ranks_text(s.rank for s in lost)} vanished without last words while "
                  f"{ranks_text(running)} still run",
            evidence=[f"rank {s.rank} on {s.host} (pid {s.pid}): connection lost, no exit record, "
                      f"last step {_last_step(s, histories)}" for s in lost],
            remedy=("killed from outside (OOM killer: dmesg | grep -i kill; scheduler; SIGKILL) or its node "
                    "is unreachable; check the node's memory and logs"),
        ))
    if exited and running:
        out.append(Finding(
            kind="rank_lost", severity="info", ranks=[s.rank for s in exited],
            title=(f"{ranks_text(s.rank for s in exited)} exited cleanly while "
                   f"{ranks_text(running)} still run"),
            evidence=[f"rank {s.rank}: exited at step {_last_step(s, histories)}" for s in exited],
            remedy="expected at the end of training; earlier, the ranks ran different amounts of work",
        ))
    return out


def _last_alive(state: RankState, histories: dict[int, list[Sample]]) -> float:
    # The stub a viewer builds for a dead rank carries the viewer's clock and step 0;
    # the rank's own last sample with progress says when it was last alive.
    samples = [s for s in histories.get(state.rank, []) if s.step or s.seq]
    return samples[-1].time if samples else state.time


def _last_step(state: RankState, histories: dict[int, list[Sample]]) -> int:
    samples = histories.get(state.rank, [])
    return max([state.step] + [s.step for s in samples])


def _crash_remedy(state: RankState) -> str:
    reason = state.exit_reason.lower()
    if "sigsegv" in reason or "signal 11" in reason or "segmentation" in reason:
        return ("a native crash: read the stack in the crash file; check that every rank has the same GPU "
                "model/compute capability, driver, CUDA and cuDNN build, and GPU memory headroom; try one "
                "GPU, then grow")
    if "outofmemory" in reason.replace(" ", "") or "out of memory" in reason:
        return "reduce the batch size or enable activation checkpointing; check other processes on that GPU"
    return "read the exception and stack above (crash file); fix it on that rank, then restart the job"
