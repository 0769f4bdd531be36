"""Fleet metrics: the node agent's view of its job in Prometheus text exposition.

``ddptop launch --metrics-port [ADDR:]PORT`` (or ``DDPTOP_METRICS_PORT``; off by default)
serves ``/metrics`` through ``prometheus_client``. Every scrape reads the agent's
:class:`~ddptop.model.job.JobModel` at that moment: nothing is sampled twice, and nothing
here reaches a rank (the agent already receives every state the ranks send).

What a scrape shows, for this node's ranks (a multi-node job: one agent per node, each
scraped on its own; the ``host`` label tells them apart):

* per rank: status (one series, value 1, labelled with the status word), step, mean step
  time, data-wait share, age of the last sample, loader readiness, CPU, RSS, GPU use;
* per rank and process group: collective seq, number of pending collectives, age of the
  oldest one (0 when none is pending, so ``> 60`` is an alert);
* per finding kind and severity: how many findings the diagnosis names now (every
  kind/severity pair is present, 0 when quiet, so an alert never has to tell "absent"
  from "fine");
* the agent itself: ``ddptop_agent_info``, the black box's size, and the standard
  ``process_*`` series of the agent process.

A value a rank cannot tell (no GPU, no step yet) is absent, never 0: nvitop's "N/A".
The label is ``job_id``, not ``job``: Prometheus gives every scraped series a ``job``
label of its own (the scrape config's), and would rename ours.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ddptop.diagnosis.engine import diagnose
from ddptop.diagnosis.finding import KINDS, SEVERITY_ORDER, Finding
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState, Sample
from ddptop.status import Status

DIAGNOSE_EVERY_S = 1.0  # a scrape storm re-runs the diagnosis at most once a second

RANK_LABELS = ("job_id", "rank", "host")
GROUP_LABELS = ("job_id", "rank", "host", "pg", "pg_desc")


@dataclass(frozen=True)
class AgentView:
    """What one scrape reads from the agent, taken under its lock."""

    job_id: str
    host: str
    version: str
    snapshot: JobSnapshot
    histories: dict[int, list[Sample]]
    record_bytes: int

    @staticmethod
    def local(job_id: str, host: str, snapshot: JobSnapshot, histories: dict[int, list[Sample]],
              record_bytes: int, local: set[int]) -> AgentView:
        """The view of this node's ranks (*local*: those it heard of itself) only: the others
        are their own agents' to report (the agent's model also holds what the exchange told
        of them), and not "unreachable" here."""
        from ddptop._version import __version__

        snapshot.job.unreachable = {r: why for r, why in snapshot.job.unreachable.items() if r in local}
        snapshot.ranks = [s for s in snapshot.ranks if s.rank in local]
        return AgentView(job_id=job_id, host=host, version=__version__, snapshot=snapshot,
                         histories=histories, record_bytes=record_bytes)


def rank_families(snapshot: JobSnapshot, now: float) -> list[Metric]:
    """Per-rank and per-group gauges of *snapshot* at *now* (pure)."""
    job = snapshot.job.id

    def gauge(name: str, doc: str, labels: tuple[str, ...] = RANK_LABELS,
              unit: str = "") -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=list(labels), unit=unit)

    status = gauge("ddptop_rank_status", "1 for the rank's current status word",
                   (*RANK_LABELS, "status"))
    step = gauge("ddptop_rank_step", "optimizer steps the rank completed")
    step_time = gauge("ddptop_rank_step_seconds", "mean time of the rank's recent steps")
    data_wait = gauge("ddptop_rank_data_wait_ratio", "share of step time spent waiting for input (0-1)")
    age = gauge("ddptop_rank_sample_age_seconds", "seconds since the rank's last sample")
    ready = gauge("ddptop_rank_loader_ready_batches", "batches the training DataLoader has ready")
    cpu = gauge("ddptop_rank_cpu_percent", "CPU use of the rank process (100 = one core)")
    rss = gauge("ddptop_rank_rss_bytes", "resident memory of the rank process")
    gpu_util = gauge("ddptop_rank_gpu_utilization_percent", "GPU utilisation (NVML)")
    gpu_mem = gauge("ddptop_rank_gpu_memory_used_bytes", "GPU memory in use (NVML)")
    seq = gauge("ddptop_collective_seq", "collective sequence number of the process group",
                GROUP_LABELS)
    pending = gauge("ddptop_collective_pending", "collectives entered and not completed", GROUP_LABELS)
    oldest = gauge("ddptop_collective_oldest_pending_seconds",
                   "age of the oldest pending collective (0: none pending)", GROUP_LABELS)
    for st in snapshot.ranks:
        labels = [job, str(st.rank), st.host]
        status.add_metric([*labels, str(st.status)], 1)
        if st.status == Status.STARTING and not st.step:
            continue  # nothing measured yet: absent, not zero
        step.add_metric(labels, st.step)
        if st.time:
            age.add_metric(labels, max(0.0, now - st.time))
        _maybe(step_time, labels, st.step_time_s)
        _maybe(data_wait, labels, st.data_wait_fraction)
        _maybe(ready, labels, st.loader_ready_batches)
        _maybe(cpu, labels, st.cpu_percent)
        _maybe(rss, labels, st.rss_bytes)
        if st.gpu is not None:
            _maybe(gpu_util, labels, st.gpu.util_percent)
            _maybe(gpu_mem, labels, st.gpu.mem_used_bytes)
        for g in st.collectives:
            glabels = [*labels, g.pg, g.desc]
            seq.add_metric(glabels, g.seq)
            pending.add_metric(glabels, len(g.pending))
            oldest.add_metric(glabels, max((_op_age(op.age_s, st, now) for op in g.pending), default=0.0))
    return [status, step, step_time, data_wait, age, ready, cpu, rss, gpu_util, gpu_mem, seq, pending, oldest]


def findings_family(job_id: str, findings: Iterable[Finding]) -> GaugeMetricFamily:
    """``ddptop_findings{kind, severity}``: every pair present, 0 when quiet (pure)."""
    counts = {(kind, sev): 0 for kind in sorted(KINDS) for sev in SEVERITY_ORDER}
    for f in findings:
        counts[(f.kind, f.severity)] = counts.get((f.kind, f.severity), 0) + 1
    family = GaugeMetricFamily("ddptop_findings", "findings the diagnosis names now, by kind and severity",
                               labels=["job_id", "kind", "severity"])
    for (kind, sev), n in sorted(counts.items()):
        family.add_metric([job_id, kind, sev], n)
    return family


def agent_families(view: AgentView) -> list[Metric]:
    """The agent's own series (pure)."""
    info = GaugeMetricFamily("ddptop_agent_info", "the node agent serving these metrics",
                             labels=["job_id", "host", "version"])
    info.add_metric([view.job_id, view.host, view.version], 1)
    record = GaugeMetricFamily("ddptop_record_bytes", "size of the job's black-box record on this host",
                               labels=["job_id"])
    record.add_metric([view.job_id], view.record_bytes)
    return [info, record]


def _maybe(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, value)


def _op_age(age_s: float, state: RankState, now: float) -> float:
    # The op's age when sampled plus the time since (diagnosis.common.op_age, without the op).
    return age_s + max(0.0, now - state.time) if state.time else age_s


class JobCollector(Collector):
    """A prometheus_client collector over the agent's model, read afresh at every scrape."""

    def __init__(self, read: Callable[[float], AgentView], clock: Callable[[], float] = time.time) -> None:
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()  # the HTTP server scrapes on a thread per request
        self._findings: list[Finding] = []
        self._diagnosed_at = float("-inf")

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: registering must not scrape the job."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, from one consistent view of the agent's model."""
        now = self._clock()
        view = self._read(now)
        yield from agent_families(view)
        yield from rank_families(view.snapshot, now)
        yield findings_family(view.job_id, self._diagnosis(view, now))

    def _diagnosis(self, view: AgentView, now: float) -> list[Finding]:
        with self._lock:
            if now - self._diagnosed_at >= DIAGNOSE_EVERY_S or now < self._diagnosed_at:
                self._findings = diagnose(view.snapshot, view.histories, now)
                self._diagnosed_at = now
            return self._findings


def registry_for(collector: Collector) -> CollectorRegistry:
    """A registry of *collector* plus the agent process's own ``process_*`` series."""
    from prometheus_client import ProcessCollector

    registry = CollectorRegistry()
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry

