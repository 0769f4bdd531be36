"""Run a probe the way a user of ``ddptop.install()`` runs a script: one line first, then it.

``torchrun ... tests/install_runner.py probes/X.py ARGS`` (no ``ddptop launch``).
"""

import runpy
import sys

import ddptop

ddptop.install()
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
