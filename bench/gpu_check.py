"""Check the NVML and NCCL paths on a real GPU: what the reporter sees, printed as a table.

    python bench/gpu_check.py [--out DIR]

Needs a CUDA machine with torch. It runs two real jobs under ``ddptop launch``, one rank
each (NCCL refuses two ranks on one GPU, so one GPU allows one rank):

1. ``probes/healthy.py`` with nccl: a ``ddptop snapshot --json`` mid-run must show the
   ``gpu`` field filled from NVML, backend ``nccl``, ``nccl:`` op names and a c10d seq
   that advances with DDP's all-reduces.
2. This file as the training script (``RANK`` set): a few steps, then seconds of matrix
   products queued on the GPU stream, then an ``all_reduce`` behind them. NCCL enqueues
   the collective at once and the host blocks in ``synchronize()``, so the Flight
   Recorder holds it as not completed while the queue drains: ``pending`` must show it
   with a growing age and its NCCL ``state``. ``doctor --json`` is captured as well.

Snapshots, doctor output and the table go to ``--out`` (default: a temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ddptop.proctree import stop_tree

BIN = Path(sys.executable).parent


def queued_collective_worker(busy_s: float) -> None:
    """Train a few DDP steps, then queue *busy_s* of GPU work and an all_reduce behind it."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    model = DDP(nn.Linear(256, 256).cuda(), device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(20):
        opt.zero_grad()
        model(torch.randn(64, 256, device="cuda")).sum().backward()
        opt.step()
    torch.cuda.synchronize()
    a = torch.randn(8192, 8192, device="cuda")
    start = time.monotonic()
    a @ a
    torch.cuda.synchronize()
    one = max(time.monotonic() - start, 1e-4)
    for _ in range(int(busy_s / one)):
        a = a @ a
        a = a / a.norm()
    flag = torch.ones(1, device="cuda")
    dist.all_reduce(flag)  # enqueued behind the products: pending until they drain
    print(f"queued {int(busy_s / one)} products of {one * 1e3:.1f} ms, then all_reduce", flush=True)
    torch.cuda.synchronize()
    print("all_reduce done", flush=True)
    time.sleep(2)
    dist.destroy_process_group()


def _env(runtime: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["DDPTOP_RUNTIME_DIR"] = str(runtime)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _start(script: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "ddptop", "launch", "--", str(BIN / "torchrun"), "--standalone",
           "--nproc-per-node", "1", *script]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _ddptop(env: dict[str, str], *args: str) -> tuple[int, Any]:
    proc = subprocess.run([sys.executable, "-m", "ddptop", *args], env=env, cwd=ROOT,
                          capture_output=True, timeout=60)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        return proc.returncode, {"stdout": proc.stdout.decode(errors="replace"),
                                 "stderr": proc.stderr.decode(errors="replace")}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    stop_tree(proc)


def _rank0(snap: Any) -> dict[str, Any] | None:
    ranks = snap.get("ranks") if isinstance(snap, dict) else None
    return ranks[0] if ranks else None


def check_healthy(out: Path, rows: list[tuple[str, str]]) -> None:
    """Phase 1: the healthy probe with nccl; NVML fields, backend, op names, seq."""
    runtime = Path(tempfile.mkdtemp(prefix="ddptop-rt-"))
    env = _env(runtime) | {"PROBE_SECONDS": "25", "PROBE_STEP_SLEEP": "0.01"}
    proc = _start(["probes/healthy.py"], env, out / "healthy.log")
    try:
        snaps: list[Any] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(snaps) < 2:
            rc, snap = _ddptop(env, "snapshot", "--json")
            r = _rank0(snap)
            if rc == 0 and r and r.get("step", 0) > 5:
                snaps.append(snap)
                time.sleep(3)
            else:
                time.sleep(1)
        (out / "healthy_snapshots.json").write_text(json.dumps(snaps, indent=1))
        if len(snaps) < 2:
            rows.append(("healthy: snapshots", f"FAILED ({len(snaps)} taken)"))
            return
        first, last = _rank0(snaps[0]), _rank0(snaps[1])
        assert first and last
        gpu = last.get("gpu") or {}
        rows.append(("healthy: backend", str(snaps[1]["job"].get("backend"))))
        rows.append(("healthy: gpu", json.dumps(gpu)))
        groups = {g["pg"]: g["seq"] for g in first.get("collectives", [])}
        later = {g["pg"]: g["seq"] for g in last.get("collectives", [])}
        rows.append(("healthy: seq first -> later", f"{groups} -> {later}"))
        rows.append(("healthy: step first -> later", f"{first['step']} -> {last['step']}"))
        rows.append(("healthy: versions", json.dumps(last.get("versions"))))
        rows.append(("healthy: reporter", json.dumps(last.get("reporter"))))
    finally:
        _stop(proc)


def check_queued(out: Path, rows: list[tuple[str, str]], busy_s: float) -> None:
    """Phase 2: an all_reduce queued behind GPU work shows as pending with its age."""
    runtime = Path(tempfile.mkdtemp(prefix="ddptop-rt-"))
    env = _env(runtime) | {"GPU_CHECK_BUSY_S": str(busy_s)}
    proc = _start([str(Path(__file__).resolve())], env, out / "queued.log")
    try:
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + busy_s + 60
        doctor: Any = None
        while time.monotonic() < deadline and proc.poll() is None:
            _rc, snap = _ddptop(env, "snapshot", "--json")
            r = _rank0(snap)
            pending = [op for g in (r or {}).get("collectives", []) for op in g.get("pending", [])]
            if pending:
                seen.append({"t": time.monotonic(), "pending": pending, "status": (r or {}).get("status")})
                if doctor is None and len(seen) >= 3:
                    doctor = _ddptop(env, "doctor", "--json", "--watch", "3")
            time.sleep(1)
        (out / "queued_pending.json").write_text(json.dumps(seen, indent=1))
        (out / "queued_doctor.json").write_text(json.dumps(doctor, indent=1))
        if not seen:
            rows.append(("queued: pending", "NONE SEEN"))
            return
        ops = [(p["op"], p["state"], round(p["age_s"], 1)) for s in seen for p in s["pending"]]
        rows.append(("queued: pending op/state/age", f"{ops[0]} ... {ops[-1]} ({len(seen)} snapshots)"))
        rows.append(("queued: doctor", json.dumps(doctor)[:400]))
    finally:
        _stop(proc)


def main() -> None:
    """Run both phases and print what the reporter saw."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--busy", type=float, default=12.0, help="seconds of queued GPU work")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ddptop-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str]] = []
    check_healthy(out, rows)
    check_queued(out, rows, args.busy)
    width = max(len(k) for k, _ in rows)
    table = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    (out / "table.txt").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    if "RANK" in os.environ:
        queued_collective_worker(float(os.environ.get("GPU_CHECK_BUSY_S", "12")))
    else:
        main()
