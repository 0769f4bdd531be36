"""What ``ddptop demo`` runs: a real training script with a planted fault, shipped in the package.

``unseeded_split.py`` (failure F5 of the catalog) is started by ``ddptop demo`` as a script
under ``ddptop launch -- torchrun``, so an installed ddptop (``pip install ./ddptop``, or
its wheel) runs ``ddptop demo`` without a source checkout. Needs torch; nothing in ddptop
imports this package (the probes of the test suite share its helpers, ``train_common``).
"""
