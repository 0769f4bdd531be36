"""DeepSpeed's CPU shared-memory op, compiled once for the DeepSpeed test jobs.

DeepSpeed compiles ``deepspeed_shm_comm`` (torch's JIT C++ extension build, ninja) the first
time a job on its CPU accelerator initialises its communication, whatever its config says:
about a minute of two idle cores, and five when four ranks of two jobs start together on a
loaded machine. `make venv` builds it here (``python -m tests.deepspeed_op``) into the venv,
and ``tests/test_deepspeed_e2e.py`` points its jobs there (``TORCH_EXTENSIONS_DIR``), or
builds it first where it is missing. The build runs with the venv's ``ninja`` first on PATH,
as the jobs have it (``tests.jobs.JobRunner.env``): the system's ninja, another version,
would rebuild it all in every job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXTENSIONS = Path(sys.prefix) / "torch-extensions"  # the venv's own: a fresh clone builds its own
BIN = Path(sys.executable).parent
_LOAD = "from deepspeed.accelerator import get_accelerator; " \
        "get_accelerator().create_op_builder('ShareMemCommBuilder').load()"


def built(extensions: Path = EXTENSIONS) -> bool:
    """Whether the op's library is there (torch rebuilds it if its sources or flags changed)."""
    return (extensions / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file()


def build(extensions: Path = EXTENSIONS, timeout_s: float = 900.0) -> None:
    """Compile (or find up to date) the op in *extensions*, in a child Python (deepspeed's
    import costs seconds and is never done in the test process)."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(extensions),
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    res = subprocess.run([sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True,
                         timeout=timeout_s, check=False)
    if res.returncode != 0 or not built(extensions):
        raise RuntimeError(f"DeepSpeed's shm op did not build (rc {res.returncode}):\n{res.stderr[-3000:]}")


if __name__ == "__main__":
    build()
