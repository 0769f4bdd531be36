"""The diagnosis entry point: run every rule, isolate failures, sort by severity."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from ddptop.diagnosis import (
    rules_collectives,
    rules_divergence,
    rules_identity,
    rules_last_words,
    rules_network,
    rules_postmortem,
    rules_progress,
    rules_reports,
    rules_resources,
    rules_system,
    rules_unresponsive,
    rules_waits,
    rules_watchdog,
    rules_wavefront,
)
from ddptop.diagnosis.claims import Claim, claim_findings
from ddptop.diagnosis.cluster_findings import cluster_findings, why_no_one
from ddptop.diagnosis.config import DiagnosisConfig
from ddptop.diagnosis.culprit_frames import with_frames
from ddptop.diagnosis.finding import SEVERITY_ORDER, Finding
from ddptop.diagnosis.memo import one_diagnosis
from ddptop.diagnosis.story import one_story
from ddptop.model.pace import give_way
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import Sample

log = logging.getLogger(__name__)

Rule = Callable[[JobSnapshot, dict[int, list[Sample]], float, DiagnosisConfig], list[Finding]]

# Order matters only for ties in the output: root causes before their consequences. A rank
# that ran a different collective comes before the rank that died of it (on gloo the victim
# of a mismatch often aborts first).
RULES: tuple[Rule, ...] = (
    rules_reports.desync_report,  # PyTorch's own comparison of every rank: the strongest evidence
    rules_reports.fingerprint_mismatch,
    rules_wavefront.collective_wavefront,  # dumped ops: different calls at one seq
    rules_collectives.collective_mismatch,
    rules_last_words.gloo_size_mismatch,
    rules_watchdog.watchdog_timeout,
    rules_divergence.collective_divergence,
    rules_postmortem.node_lost,
    rules_network.host_unreachable,  # a partition: before the stall it causes
    rules_postmortem.rank_lost,
    rules_unresponsive.rank_unresponsive,
    rules_progress.unequal_batches,
    rules_identity.param_mismatch,
    rules_waits.collective_stall,  # the wait-for graph: the sinks of the ranks' waits
    rules_progress.straggler,
    rules_progress.input_bound,
    rules_system.cpu_oversubscribed,
    rules_system.shm_pressure,
    rules_resources.resource_exhaustion,  # before the death it foresees: still a warning
    rules_system.gpu_heterogeneous,
    rules_system.version_mismatch,
    rules_identity.rng_divergence,
)


# The rules judged over a window of each rank's samples (window_s): half the cost of a
# diagnosis at 32,768 ranks, and a verdict that cannot change much within seconds.
RATE_RULES: tuple[Rule, ...] = (rules_progress.straggler, rules_progress.input_bound,
                                # a forecast minutes ahead (0.2-0.3 s of CPU at 32,768 ranks, #48)
                                rules_resources.resource_exhaustion)


def diagnose(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
             config: DiagnosisConfig | None = None, claims: Sequence[Claim] = ()) -> list[Finding]:
    """Every finding for the job at *now*, most severe first (pure; the clock is passed in).
    *claims*: what a console log's statements say (:mod:`ddptop.diagnosis.claims`)."""
    return diagnose_by_rule(snapshot, histories, now, config, claims=claims)[0]


def diagnose_by_rule(snapshot: JobSnapshot, histories: dict[int, list[Sample]], now: float,
                     config: DiagnosisConfig | None = None, reuse: Mapping[Rule, list[Finding]] | None = None,
                     claims: Sequence[Claim] = ()) -> tuple[list[Finding], dict[Rule, list[Finding]]]:
    """:func:`diagnose`, and each rule's own findings; a rule in *reuse* is not run, its
    findings there are taken as they are (ddptop.diagnosis.cadence: the rate rules of a big
    job between two of their runs). The claims' findings come before every rule's: a
    statement that names its culprit is the strongest evidence a log holds."""
    config = config or DiagnosisConfig()
    told_by_logs = claim_findings(list(claims)) + cluster_findings(claims)
    found: list[tuple[int, Finding]] = [(-1, f) for f in told_by_logs]
    by_rule: dict[Rule, list[Finding]] = {}
    # What several rules derive alike (active ranks, rate windows...) is computed once (memo).
    with one_diagnosis():
        for index, rule in enumerate(RULES):
            if reuse is not None and rule in reuse:
                by_rule[rule] = reuse[rule]
            else:
                give_way()  # between two rules: the caller's other work may go first (model.pace)
                try:
                    by_rule[rule] = rule(snapshot, histories, now, config)
                except Exception:  # one broken rule must not hide what the others found
                    log.exception("diagnosis rule %s failed", getattr(rule, "__name__", rule))
                    continue
            found += [(index, f) for f in by_rule[rule]]
    found.sort(key=lambda item: (-SEVERITY_ORDER[item[1].severity], item[0], item[1].ranks))
    found = one_story(found)  # one lead per event; what followed from it, told as its spread
    placed = with_frames([f for _, f in found], snapshot)  # where each culprit is in the code
    found = [(index, f) for (index, _), f in zip(found, placed, strict=True)]
    found.sort(key=lambda item: (-SEVERITY_ORDER[item[1].severity], item[0], item[1].ranks))
    told = [f for _, f in found]
    # A log understood but blaming no one says so (#54): what was recognised, and why.
    explained = why_no_one(told, claims)
    return told + ([explained] if explained is not None else []), by_rule
