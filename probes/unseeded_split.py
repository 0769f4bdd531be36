"""F5 of the failure catalog: an unseeded train/test split desyncs the job at checkpoint save.

The script is ``ddptop/_demo/unseeded_split.py`` (it ships in the package: ``ddptop demo``
runs it); this probe runs it unchanged, so tests, screenshots and the demo share one job.
Run: ``torchrun --standalone --nproc-per-node 4 probes/unseeded_split.py``.
"""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("ddptop._demo.unseeded_split", run_name="__main__", alter_sys=True)
