"""The synthetic-job generator: real sockets, real protocol, attached by the real clients.

Every wait is bounded and every generator is stopped in a fixture or ``finally``; each
test uses a private runtime directory (the ``runtime_dir`` fixture).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddptop.client.targets import resolve
from ddptop.client.watch import live_snapshot
from ddptop.errors import UsageError
from ddptop.model.rank_view import LOST
from ddptop.protocol import Request, StateMsg
from ddptop.reporter.collectives import pending_from_fr
from ddptop.testing.synthetic import FakeRanks, SyntheticJob, ensure_fd_limit, run_in_subprocess
from ddptop.wire import HEADER, LENGTH, encode_frame, header_bytes
from tests.jobs import wait_until
from tests.rank_connection import RankConnection
from tests.watched import Watched

ROOT = Path(__file__).resolve().parent.parent


def test_live_source_gets_64_ranks_with_evolving_values(runtime_dir: Path,
                                                        watch: Callable[..., Watched]) -> None:
    with SyntheticJob(64, "syn64", interval_s=0.2, runtime_dir=runtime_dir, steps_per_s=5.0):
        att = watch("syn64")
        wait_until(lambda: att.with_state() == 64, 20, "state from all 64 ranks")
        first = att.read(lambda m: {r: (v.state.step, v.state.collectives[0].seq)  # type: ignore[union-attr]
                                    for r, v in m.ranks.items()})
        assert isinstance(first, dict)

        def advanced() -> bool:
            now = att.read(lambda m: {r: v.state.step for r, v in m.ranks.items()})  # type: ignore[union-attr]
            assert isinstance(now, dict)
            return all(now[r] > first[r][0] for r in range(64))

        wait_until(advanced, 20, "every rank's step to advance")
        states = att.read(lambda m: [v.state for v in m.ranks.values()])
        assert isinstance(states, list)
        assert {s.host for s in states} == {f"synth{i:04d}" for i in range(8)}
        assert all(s.status == "running" and s.batches_per_epoch == 240 and s.gpu is None for s in states)
        assert all(len(att.model.ranks[r].history) >= 2 for r in range(64))
        stacks = att.source.request_stacks(timeout=10)
        assert not stacks.errors and len(stacks.stacks) == 64
        main = next(t for t in stacks.stacks[5].threads if t.is_main)
        assert main.frames[0].file.endswith("train.py")
        traces = att.source.request_fr_traces([0, 1], timeout=10)
        assert json.loads(traces[0].json)["entries"]


def test_snapshot_cli_sees_a_subprocess_generator(tmp_path: Path) -> None:
    rt = tmp_path / "rt"
    env = dict(os.environ, DDPTOP_RUNTIME_DIR=str(rt), PYTHONPATH=str(ROOT))
    gen = run_in_subprocess(64, "snap64", interval_s=0.5, runtime_dir=rt, ready_timeout=60)
    try:
        assert gen.banner.startswith("ready")

        def snapshot() -> dict[str, object]:
            res = subprocess.run([sys.executable, "-m", "ddptop", "snapshot", "--json", "snap64"], env=env,
                                 capture_output=True, text=True, timeout=60, check=False)
            assert res.returncode == 0, res.stderr
            return dict(json.loads(res.stdout))

        one = snapshot()
        job = one["job"]
        assert isinstance(job, dict) and job["answered"] == 64 and not job["unreachable"]
        before = {r["rank"]: r["step"] for r in one["ranks"]}  # type: ignore[index]
        wait_until(lambda: all(r["step"] > before[r["rank"]] for r in snapshot()["ranks"]),  # type: ignore[index]
                   timeout=30, what="every rank to make progress")
    finally:
        gen.stop()
    assert gen.proc.returncode is not None
    assert not list(rt.glob("snap64.*.json")), "records must be removed at stop"


def test_desync_differing_batches_per_epoch_and_pending_ops(runtime_dir: Path) -> None:
    with SyntheticJob(8, "desync", "desync", interval_s=0.2, runtime_dir=runtime_dir,
                      desync_after_s=1.0, seed=3) as job:
        odd = job.odd_rank
        assert odd != 0
        def desynced() -> bool:
            snap = live_snapshot(resolve("desync"), None, 10)
            return any(s.batches_per_epoch != 240 for s in snap.ranks) and all(
                s.collectives and s.collectives[0].pending for s in snap.ranks)

        wait_until(desynced, timeout=30, what="the desync to show")
        snap = live_snapshot(resolve("desync"), None, 10)
        by_rank = {s.rank: s for s in snap.ranks}
        assert len(by_rank) == 8
        assert {r for r, s in by_rank.items() if s.batches_per_epoch != 240} == {odd}
        pending = {r: s.collectives[0].pending for r, s in by_rank.items()}
        assert all(len(p) == 1 for p in pending.values())
        assert len({p[0].seq for p in pending.values()}) == 1, "all ranks wait at the same seq"
        assert {r for r, p in pending.items() if p[0].op == "gloo:all_gather"} == {odd}
        assert all(p[0].op == "gloo:all_reduce" for r, p in pending.items() if r != odd)
        with RankConnection(job.endpoints[odd]) as conn:
            frames = [f.function for f in conn.stacks().threads[0].frames]
            fr = pending_from_fr(conn.fr_trace().json, time.time())
        assert frames[-2:] == ["all_gather_object", "all_gather"] and "save_checkpoint" in frames
        assert [op.op for op in fr["0"]] == ["gloo:all_gather"]


def test_stall_all_ranks_pending_in_the_first_collective(runtime_dir: Path) -> None:
    with SyntheticJob(4, "stall", "stall", interval_s=0.2, runtime_dir=runtime_dir):
        snap = live_snapshot(resolve("stall"), None, 10)
    assert len(snap.ranks) == 4
    for s in snap.ranks:
        assert s.step == 0 and s.collectives[0].seq == 1
        assert [(p.seq, p.op) for p in s.collectives[0].pending] == [(1, "gloo:broadcast")]


def test_lost_rank_turns_lost_in_the_model(runtime_dir: Path, watch: Callable[..., Watched]) -> None:
    with SyntheticJob(8, "lost", "lost", interval_s=0.2, runtime_dir=runtime_dir, lost_after_s=1.5) as job:
        att = watch("lost")
        wait_until(lambda: att.with_state() == 8, 20, "state from all 8 ranks")
        odd = job.odd_rank
        wait_until(lambda: att.read(lambda m: m.view(odd).status(time.time())) == LOST, 20, "rank lost")
        statuses = att.read(lambda m: m.statuses(time.time()))
        assert isinstance(statuses, dict)
        assert [r for r, s in statuses.items() if s != "running"] == [odd]


def test_bad_clients_do_not_disturb_the_generator(runtime_dir: Path) -> None:
    with SyntheticJob(4, "bad", interval_s=0.2, runtime_dir=runtime_dir) as job:
        ep = job.endpoints[1]
        bad: list[socket.socket] = []
        try:
            for payload in (b"GET / HTTP/1.0\r\n\r\n",  # not ddptop
                            struct.pack(">6sH", b"DDPTOP", 99),  # wrong version
                            header_bytes() + LENGTH.pack(1 << 30),  # oversized frame
                            header_bytes() + LENGTH.pack(3) + b"\xc1\xc1\xc1",  # undecodable
                            b"DDP"):  # half a header, then silence
                sock = socket.create_connection((ep.host, ep.port), timeout=5)
                sock.sendall(payload)
                bad.append(sock)
            # A subscriber that never reads: its output is capped, nobody else waits for it.
            lazy = socket.create_connection((ep.host, ep.port), timeout=5)
            lazy.sendall(header_bytes() + encode_frame(Request(command="subscribe", id=1)))
            bad.append(lazy)
            with RankConnection(ep, timeout=5) as conn:
                conn._send(Request(command="reboot", id=7))  # not a command: ErrorMsg, connection stays
                reply = conn.receive()
                assert getattr(reply, "id", None) == 7 and "unsupported" in getattr(reply, "reason", "")
                assert isinstance(conn.state(), StateMsg)
            for endpoint in job.endpoints:
                with RankConnection(endpoint, timeout=5) as conn:
                    assert conn.state().state.rank == endpoint.rank
            raw = bad[0].recv(HEADER.size)
            assert raw[:6] == b"DDPTOP"  # the server spoke first; the garbage got it dropped
        finally:
            for sock in bad:
                sock.close()


def test_values_are_deterministic_per_seed() -> None:
    a, b = (FakeRanks(16, "d", "healthy", 1.0, t0=1000.0, seed=7) for _ in range(2))
    c = FakeRanks(16, "d", "healthy", 1.0, t0=1000.0, seed=8)
    assert [a.sample(r, k) for r in range(16) for k in range(5)] == [b.sample(r, k) for r in range(16)
                                                                     for k in range(5)]
    assert [a.sample(r, 3).cpu_percent for r in range(16)] != [c.sample(r, 3).cpu_percent for r in range(16)]
    assert len(a.history(3, 1000)) == 600 and a.history(3, 1000)[-1] == a.sample(3, 1000)


def test_fd_limit_too_low_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="open files"):
        ensure_fd_limit(1 << 40)
