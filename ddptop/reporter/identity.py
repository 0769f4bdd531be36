"""Which rank this process is, however it was launched (#22).

torchrun sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``; ``srun`` sets ``SLURM_PROCID``/
``SLURM_LOCALID``/``SLURM_NTASKS`` (and the job's ``SLURM_JOB_ID``/``SLURM_STEP_ID``); Open
MPI's ``mpirun`` sets ``OMPI_COMM_WORLD_RANK``/``_LOCAL_RANK``/``_SIZE``; MPICH and Intel MPI
(PMI) set ``PMI_RANK``/``PMI_SIZE`` (and ``MPI_LOCALRANKID``). A script started by none of
them (``torch.multiprocessing.spawn``, its own launcher) passes its rank to
``init_process_group`` only: :func:`from_process_group` reads it there.

The order is the launcher closest to the process: torchrun under srun sets both, and
torchrun's numbering is the one the process group uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# (launcher, rank, local rank, world size) variables, closest launcher first.
_SOURCES = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("pmi", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
)
RANK_VARIABLES = tuple(names[1] for names in _SOURCES)  # any of these makes a process a rank


@dataclass(frozen=True)
class RankIdentity:
    """A process's place in its job, and who said so."""

    rank: int
    local_rank: int
    world_size: int
    source: str  # torchrun / slurm / openmpi / pmi / process_group
    scheduler_job: str = ""  # the scheduler's own name for the job ("12345.0": SLURM's job.step)
    store: str = ""  # "host-port" of the process group's TCPStore, where no variable names it


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None and text.strip() else None
    except ValueError:
        return None


def from_env(env: dict[str, str]) -> RankIdentity | None:
    """The identity the launcher's variables give, or None when no launcher set one."""
    for source, rank_var, local_var, world_var in _SOURCES:
        rank = _int(env.get(rank_var))
        if rank is None or rank < 0:
            continue
        world = _int(env.get(world_var))
        local = _int(env.get(local_var))
        return RankIdentity(rank=rank, local_rank=local if local is not None and local >= 0 else rank,
                            world_size=world if world and world > rank else rank + 1, source=source,
                            scheduler_job=slurm_job(env))
    return None


def from_process_group(dist: Any, env: dict[str, str]) -> RankIdentity | None:
    """The identity of an initialised default process group (None before it exists).

    The local rank is the launcher's if one set it, else the rank's position among the
    ranks of this host is unknown and the global rank stands in (one host: the same).
    """
    try:
        if not dist.is_initialized():
            return None
        rank, world = int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        return None
    launcher_locals = [_int(env.get(names[2])) for names in _SOURCES]
    local = next((value for value in launcher_locals if value is not None), None)
    return RankIdentity(rank=rank, local_rank=local if local is not None else rank, world_size=world,
                        source="process_group", scheduler_job=slurm_job(env), store=_store_address(dist))


def _store_address(dist: Any) -> str:
    """"host-port" of the default group's TCPStore (``init_method="tcp://..."`` sets no
    MASTER_ADDR): every rank of the job shares it, so it names the job ("" if not a TCPStore)."""
    try:
        store = dist.distributed_c10d._get_default_store()
        for _ in range(8):  # PrefixStores wrap the TCPStore
            if getattr(store, "host", None) and getattr(store, "port", None):
                return f"{store.host}-{int(store.port)}"
            store = getattr(store, "underlying_store", None)
            if store is None:
                break
    except Exception:
        pass
    return ""


def slurm_job(env: dict[str, str]) -> str:
    """SLURM's name of this job step ("12345.0"; "12345" outside a step; "" outside SLURM)."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not re.fullmatch(r"\d{1,12}(_\d{1,9})?", job):
        return ""
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or ""
    return f"{job}.{step}" if re.fullmatch(r"\d{1,9}|batch|extern", step) else job
