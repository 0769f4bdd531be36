"""The probes' and the demo's training helpers end a job cleanly under gloo.

gloo's worker thread drops its references to a collective's tensors after the collective
has returned. A Python tensor released first leaves that drop needing the GIL, and at
interpreter exit the rank aborts with SIGABRT ("terminate called without an active
exception"; seen in CI when a job ran without ddptop and so exited at once). ``let_go``
holds the tensor until the worker let go; this test checks it on a real two-rank gloo job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ddptop.proctree import stop_tree

BIN = Path(sys.executable).parent
CALLS = 500

SCRIPT = f"""
import sys
import torch
import torch.distributed as dist
from ddptop._demo.train_common import let_go, setup

rank, world, device = setup()
held = settled = 0
for _ in range({CALLS}):
    flag = torch.tensor([float(rank)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    held += flag._use_count() > 1  # the worker still holds it: the race let_go is for
    let_go(flag)
    settled += flag._use_count() == 1
with open(f"{{sys.argv[1]}}.rank{{rank}}", "w") as out:  # a file each: ranks share stdout
    out.write(f"held {{held}} settled {{settled}}")
dist.destroy_process_group()
"""


def test_a_collective_tensor_is_ours_alone_once_let_go(tmp_path: Path) -> None:
    script = tmp_path / "let_go.py"
    script.write_text(SCRIPT)
    result = tmp_path / "result"
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(script), str(result)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        stop_tree(proc)
    assert proc.returncode == 0, out[-3000:]
    for rank in (0, 1):
        line = Path(f"{result}.rank{rank}").read_text()
        print(f"rank {rank}: {line}")
        assert line.endswith(f"settled {CALLS}"), f"rank {rank}: {line}"

