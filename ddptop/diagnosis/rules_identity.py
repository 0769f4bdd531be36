"""Identity rules: param_mismatch, rng_divergence (catalog F1, F5).

Ranks of one job must build the same model and draw the same data split; these rules
compare fingerprints across ranks.
"""

from __future__ import annotations

from collections import defaultdict

from ddptop.diagnosis.common import ranks_text
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.finding import Finding
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import ParamFingerprint, RankState, Sample


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
