"""Fleet metrics (``--metrics-port``): a real agent's HTTP endpoint, scraped and parsed with
prometheus_client's own parser; real jobs under ``ddptop launch`` and under ``install()``.

The unit tests feed a real :class:`NodeAgent` the events its live source would deliver and
scrape it over loopback; the end-to-end tests scrape the agent of a running torchrun job.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddptop.agent.metrics_http import MAX_SCRAPES_AT_ONCE, parse_listen
from ddptop.agent.node import NodeAgent
from ddptop.diagnosis.finding import KINDS, SEVERITY_ORDER
from ddptop.errors import UsageError
from ddptop.protocol import CollectiveGroup, GpuInfo, PendingOp, RankState, RecordEntry, StateMsg
from tests.jobs import JobRunner, ddptop_cmd

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, timeout: float = 5.0) -> Series:
    """Every sample at *url*, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(series: Series, name: str, **labels: str) -> float | None:
    """The one sample of *name* whose labels include *labels* (None if absent)."""
    hits = [v for (n, lab), v in series.items() if n == name and labels.items() <= dict(lab).items()]
    assert len(hits) <= 1, f"{name}{labels} matches {len(hits)} series"
    return hits[0] if hits else None


def state(rank: int, now: float, **kw: object) -> RankState:
    base: dict[str, object] = dict(rank=rank, local_rank=rank, world_size=2, host="node-a", pid=4000 + rank,
                                   job_id="mjob", status="running", time=now - 0.5, start_time=now - 600,
                                   step=120 + rank, step_time_s=0.25, data_wait_fraction=0.1,
                                   loader_ready_batches=3, cpu_percent=97.0, rss_bytes=1 << 30,
                                   backend="gloo")
    base.update(kw)
    return RankState(**base)  # type: ignore[arg-type]


@pytest.fixture
def agent(runtime_dir: Path) -> Iterator[NodeAgent]:
    node = NodeAgent("mjob", ["train.py"], 0, record=False)
    try:
        yield node
    finally:
        node.finish(0, grace_s=0)


def feed(node: NodeAgent, *states: RankState) -> None:
    for st in states:
        node._event(RecordEntry(time=st.time, rank=st.rank, message=StateMsg(state=st)))


def test_parse_listen_accepts_what_exporters_accept() -> None:
    assert parse_listen("9400") == ("0.0.0.0", 9400)
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    for bad in ("", "abc", "1.2.3.4:", "70000", "::1:9400", "host:port"):
        with pytest.raises(UsageError):
            parse_listen(bad)


def test_a_scrape_shows_each_rank_and_names_a_mismatch(agent: NodeAgent) -> None:
    now = time.time()
    gpu = GpuInfo(index=0, util_percent=88.0, mem_used_bytes=5 << 30)
    waiting = [CollectiveGroup(pg="0", seq=41, desc="default_pg", size=2, seq_changed_at=now - 9,
                               pending=[PendingOp(seq=41, op="gloo:all_reduce", age_s=8.0, started_at=now - 9,
                                                  sizes=[[[10]], [[10]]])])]
    other = [CollectiveGroup(pg="0", seq=41, desc="default_pg", size=2, seq_changed_at=now - 9,
                             pending=[PendingOp(seq=41, op="gloo:all_gather", age_s=8.0, started_at=now - 9,
                                                sizes=[[[10]], [[20]]])])]
    feed(agent, state(0, now, collectives=waiting, gpu=gpu),
         state(1, now, collectives=other, step_time_s=None, data_wait_fraction=None))
    url = agent.serve_metrics(("127.0.0.1", 0))
    assert json.loads(_record_path("mjob").read_text())["metrics_url"] == url
    series = scrape(url)

    assert value(series, "ddptop_rank_step", rank="0", job_id="mjob", host="node-a") == 120
    assert value(series, "ddptop_rank_step", rank="1") == 121
    assert value(series, "ddptop_rank_step_seconds", rank="0") == 0.25
    assert value(series, "ddptop_rank_step_seconds", rank="1") is None  # unknown: absent, not 0
    assert value(series, "ddptop_rank_data_wait_ratio", rank="0") == pytest.approx(0.1)
    assert value(series, "ddptop_rank_data_wait_ratio", rank="1") is None
    assert value(series, "ddptop_rank_gpu_utilization_percent", rank="0") == 88.0
    assert value(series, "ddptop_rank_gpu_utilization_percent", rank="1") is None
    assert value(series, "ddptop_rank_status", rank="0", status="running") == 1
    assert value(series, "ddptop_collective_seq", rank="1", pg="0", pg_desc="default_pg") == 41
    assert value(series, "ddptop_collective_pending", rank="0", pg="0") == 1
    age = value(series, "ddptop_collective_oldest_pending_seconds", rank="0", pg="0")
    assert age is not None and 8.5 <= age < 60  # its age when sampled, plus the time since
    # Every kind/severity pair is present; the mismatch is counted once.
    findings = {dict(lab)["kind"] + "/" + dict(lab)["severity"]: v
                for (n, lab), v in series.items() if n == "ddptop_findings"}
    assert set(findings) == {f"{k}/{s}" for k in KINDS for s in SEVERITY_ORDER}
    assert findings["collective_mismatch/critical"] == 1
    assert value(series, "ddptop_agent_info", job_id="mjob") == 1
    assert value(series, "process_cpu_seconds_total") is not None  # the agent's own process


def _record_path(job_id: str) -> Path:
    from ddptop.store import jobrecord

    return jobrecord.job_dir(job_id) / jobrecord.RECORD_FILE


def test_a_quiet_job_scrapes_zero_findings_and_time_moves_ages(agent: NodeAgent) -> None:
    now = time.time()
    feed(agent, state(0, now), state(1, now))
    url = agent.serve_metrics(("127.0.0.1", 0))
    series = scrape(url)
    assert sum(v for (n, _), v in series.items() if n == "ddptop_findings") == 0
    assert value(series, "ddptop_collective_seq", rank="0") is None  # no group reported: absent
    first = value(series, "ddptop_rank_sample_age_seconds", rank="0")
    assert first is not None and first >= 0.5
    deadline = time.monotonic() + 10
    later = first
    while later <= first and time.monotonic() < deadline:  # a scrape reads the model afresh
        time.sleep(0.05)
        later = value(scrape(url), "ddptop_rank_sample_age_seconds", rank="0") or first
    assert later > first


def test_a_flood_of_idle_connections_is_bounded_and_scrapes_resume(agent: NodeAgent) -> None:
    feed(agent, state(0, time.time()))
    url = agent.serve_metrics(("127.0.0.1", 0))
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    threads_before = threading.active_count()
    idle: list[socket.socket] = []
    most = threads_before
    try:
        for _ in range(MAX_SCRAPES_AT_ONCE * 5):  # bounded: 40 connections that never speak
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            most = max(most, threading.active_count())
        # Those beyond the bound are closed by the server at once (a read sees EOF); the
        # others hold a thread each until they speak or time out.
        refused: set[int] = set()
        deadline = time.monotonic() + 30
        while len(refused) < len(idle) - MAX_SCRAPES_AT_ONCE and time.monotonic() < deadline:
            most = max(most, threading.active_count())
            for i, s in enumerate(idle):
                if i not in refused and select.select([s], [], [], 0)[0] and s.recv(1) == b"":
                    refused.add(i)
            time.sleep(0.01)
        assert len(refused) >= len(idle) - MAX_SCRAPES_AT_ONCE
        assert most <= threads_before + MAX_SCRAPES_AT_ONCE, (most, threads_before)
    finally:
        for s in idle:
            s.close()
    # With the flood gone, the next scrape is answered (its threads notice the closed sockets).
    deadline = time.monotonic() + 15
    while True:
        try:
            assert value(scrape(url, timeout=3), "ddptop_rank_step", rank="0") == 120
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_launch_refuses_a_bad_metrics_port_and_survives_a_busy_one(job_runner: JobRunner) -> None:
    env = job_runner.env()
    bad = subprocess.run(ddptop_cmd("launch", "--metrics-port", "nope", "--", "true"), env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "metrics port" in bad.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = subprocess.run(ddptop_cmd("launch", "--metrics-port", f"127.0.0.1:{port}", "--",
                                        "python", "-c", "print('ran')"),
                             env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and "ran" in res.stdout, res.stderr
    assert "no metrics: cannot listen on 127.0.0.1" in res.stderr, res.stderr


@pytest.mark.slow
def test_a_stalled_job_shows_its_pending_age_and_the_finding(job_runner: JobRunner) -> None:
    job = job_runner.start("first_collective_stall", nproc=2, launch_args=["--metrics-port", "127.0.0.1:0"],
                           env={"PROBE_PG_TIMEOUT": "60"})
    url = job.wait_log(r"ddptop: metrics at (http://\S+/metrics)", timeout=60).group(1)
    deadline = time.monotonic() + 90
    series: Series = {}
    while time.monotonic() < deadline:
        series = scrape(url)
        age = value(series, "ddptop_collective_oldest_pending_seconds", rank="0", pg="0") or 0
        stalls = sum(v for (n, lab), v in series.items()
                     if n == "ddptop_findings" and dict(lab)["kind"] == "collective_stall")
        if age >= 3 and stalls >= 1:
            break
        time.sleep(0.25)
    else:
        shown = sorted(k for k in series if k[0] != "ddptop_findings")
        raise AssertionError(f"no stall seen in the metrics: {shown}\n{job.log()[-2000:]}")
    assert value(series, "ddptop_collective_pending", rank="0", pg="0") == 1
    assert value(series, "ddptop_collective_pending", rank="1", pg="0") in (None, 0)  # never entered it
    rows = json.loads(job.run_cli("jobs", "--json").stdout)["jobs"]
    assert [r["metrics_url"] for r in rows if r["job_id"] == job.job_id] == [url]


@pytest.mark.slow
def test_an_install_only_job_serves_metrics_from_its_spawned_agent(job_runner: JobRunner) -> None:
    job = job_runner.start("healthy", nproc=2, launcher=False, env={"DDPTOP_METRICS_PORT": "127.0.0.1:0"})
    deadline = time.monotonic() + 60
    url = ""
    while not url and time.monotonic() < deadline:  # the spawned agent says where, in job.json
        rows = json.loads(job.run_cli("jobs", "--json").stdout)["jobs"]
        url = next((r["metrics_url"] for r in rows if r["job_id"] == job.job_id), "")
        time.sleep(0.2)
    assert url, job.log()[-2000:]
    steps: dict[int, float] = {}
    while time.monotonic() < deadline:
        series = scrape(url)
        now_steps = {r: value(series, "ddptop_rank_step", rank=str(r)) or 0 for r in (0, 1)}
        if steps and all(now_steps[r] > steps[r] > 0 for r in (0, 1)) \
                and value(series, "ddptop_rank_step_seconds", rank="1"):
            break
        steps = now_steps if all(now_steps.values()) else steps
        time.sleep(0.25)
    else:
        raise AssertionError(f"steps never advanced in the metrics: {steps}\n{job.log()[-2000:]}")
    assert value(series, "ddptop_collective_seq", rank="0", pg="0")
    assert sum(v for (n, lab), v in series.items()
               if n == "ddptop_findings" and dict(lab)["severity"] != "info") == 0
