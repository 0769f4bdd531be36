"""Reporter settings, read once from the environment of the rank.

| variable | default | meaning |
|---|---|---|
| DDPTOP_BIND | 127.0.0.1 | address the rank's server binds (non-loopback needs a token) |
| DDPTOP_PORT | 0 | port (0: any free port, published in the discovery entry) |
| DDPTOP_ADVERTISE | | host name/address published for multi-node viewers |
| DDPTOP_AGENT_PORT | | the node agent's port (set by ``ddptop launch``), published with the rank |
| DDPTOP_INTERVAL | 1.0 | sampling interval in seconds |
| DDPTOP_HISTORY | 600 | samples kept in the ring buffer (10 min at 1 Hz) |
| DDPTOP_JOB_ID | | job id (set by ``ddptop launch``; else torchrun's run id) |
| DDPTOP_FR_AFTER | 2.0 | seconds of a still seq before FR is read for pending ops |
| DDPTOP_FR_TIMING | 30 | seconds between the enqueue timer's bursts (stragglers; 0: off; no FR read) |
| DDPTOP_TEARDOWN_YIELD | 0.05 | seconds destroy_process_group first sleeps (GIL released; 0: off) |
| DDPTOP_DISABLE | | set to 1 to turn the reporter off |
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ddptop import auth
from ddptop.reporter.identity import RankIdentity, from_env, slurm_job
from ddptop.store import discovery


@dataclass
class ReporterConfig:
    """Everything the reporter thread needs to know about its rank and how to serve it."""

    rank: int
    local_rank: int
    world_size: int
    job_id: str
    restart_count: int = 0
    bind: str = "127.0.0.1"
    port: int = 0
    advertise: str = ""
    agent_port: int = 0  # the node agent's endpoint, advertised beside the rank's own
    token: str | None = None
    interval_s: float = 1.0
    history_len: int = 600
    fr_after_s: float = 2.0
    fr_timing_every_s: float = 30.0
    teardown_yield_s: float = 0.05
    store_timeout_s: float = 5.0
    checkpoint_dir: str = ""  # where the job writes its large files (DDPTOP_CHECKPOINT_DIR)


def _float(env: dict[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name, default))
    except ValueError:
        return default


def job_id_from_env(env: dict[str, str], store: str = "") -> str:
    """A file-name-safe job id shared by every rank of the job: ddptop's, torchrun's, SLURM's
    job step, else the address of the job's store (*store*, or MASTER_ADDR-MASTER_PORT)."""
    raw = env.get("DDPTOP_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or ""
    if not raw or raw == "none":
        raw = slurm_job(env)  # "12345.0": SLURM's own name of the job step
    if not raw and store and "MASTER_PORT" not in env:
        raw = store
    if not raw:
        raw = f"{env.get('MASTER_ADDR', 'local')}-{env.get('MASTER_PORT', '0')}"
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", raw)[:64]
    return safe or "job"


def config_from_env(env: dict[str, str] | None = None,
                    identity: RankIdentity | None = None) -> ReporterConfig:
    """Build the config from the launcher's (or *identity*'s) and ddptop's environment variables."""
    env = dict(os.environ) if env is None else env
    identity = identity or from_env(env) or RankIdentity(rank=0, local_rank=0, world_size=1, source="")
    return ReporterConfig(
        rank=identity.rank,
        local_rank=identity.local_rank,
        world_size=identity.world_size,
        job_id=job_id_from_env(env, identity.store),
        restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
        bind=env.get("DDPTOP_BIND", "127.0.0.1"),
        port=int(env.get("DDPTOP_PORT", "0") or 0),
        advertise=env.get("DDPTOP_ADVERTISE", ""),
        agent_port=int(env.get(discovery.AGENT_PORT_ENV, "0") or 0),
        token=auth.load_token(),
        interval_s=max(0.05, _float(env, "DDPTOP_INTERVAL", 1.0)),
        history_len=min(100_000, max(10, int(_float(env, "DDPTOP_HISTORY", 600)))),  # protocol cap
        fr_after_s=_float(env, "DDPTOP_FR_AFTER", 2.0),
        fr_timing_every_s=_float(env, "DDPTOP_FR_TIMING", 30.0),
        teardown_yield_s=max(0.0, _float(env, "DDPTOP_TEARDOWN_YIELD", 0.05)),
        checkpoint_dir=env.get("DDPTOP_CHECKPOINT_DIR", ""),
    )
