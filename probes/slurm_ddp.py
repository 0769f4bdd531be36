"""A DDP script written for SLURM, no torchrun: ``srun -n 4 python probes/slurm_ddp.py``.

It does what such scripts do: ``import ddptop; ddptop.install()`` first (as the README
says), then takes its rank from ``SLURM_PROCID`` / ``SLURM_LOCALID`` / ``SLURM_NTASKS`` and
hands them to torch (``MASTER_ADDR``/``MASTER_PORT`` come from the job's environment). The
training itself is probes/rank_dies.py's: PROBE_DEATH and its friends plant a failure.
Each task prints ``rank R: slurm job J.S`` once the reporter is asked to start.
"""

from __future__ import annotations

import os
import runpy
import sys

import ddptop

# PROBE_NO_INSTALL=1: the script as it was before ddptop (`ddptop launch -- srun ...` starts it).
started = ddptop.install() if os.environ.get("PROBE_NO_INSTALL") != "1" else None
NAMES = (("RANK", "SLURM_PROCID"), ("LOCAL_RANK", "SLURM_LOCALID"), ("WORLD_SIZE", "SLURM_NTASKS"))
for ours, slurms in NAMES:
    os.environ.setdefault(ours, os.environ[slurms])
job = f"{os.environ.get('SLURM_JOB_ID')}.{os.environ.get('SLURM_STEP_ID')}"
print(f"rank {os.environ['RANK']}: slurm job {job} (install() returned {started})", flush=True)
sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_dies.py")]
runpy.run_path(sys.argv[0], run_name="__main__")
