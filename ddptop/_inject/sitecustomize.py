"""Loaded by every Python process of a job started with ``ddptop launch``.

It starts the reporter only in ranks (torchrun's: RANK set; SLURM's tasks under
``ddptop launch -- srun``; never a child of a rank), then
hands over to any ``sitecustomize`` that was already on the path, so the user's own
customisation still runs.
"""

import importlib.util
import os
import sys


def _chain_previous() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_ddptop_prev_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


def _is_rank() -> bool:
    # torchrun's ranks have RANK. Under `ddptop launch -- srun ...` (DDPTOP_LAUNCHER=srun) every
    # task SLURM starts is a rank too, but never torchrun itself (`srun torchrun ...`): its
    # children are.
    if "RANK" in os.environ:
        return True
    if os.environ.get("DDPTOP_LAUNCHER") != "srun" or "SLURM_PROCID" not in os.environ:
        return False
    argv = list(getattr(sys, "orig_argv", None) or getattr(sys, "argv", None) or [])
    return not any(os.path.basename(a) == "torchrun" or a == "torch.distributed.run" for a in argv[:4])


try:
    if _is_rank() and os.environ.get("DDPTOP_DISABLE") != "1":
        import ddptop.reporter

        ddptop.reporter.install()
except Exception as exc:  # never stop a rank from starting
    print(f"ddptop: reporter not started: {exc}", file=sys.stderr)
_chain_previous()
