"""Evidence a job left behind without ddptop: Flight Recorder dumps, torchrun's log, error files.

Files from elsewhere are data: read with caps, never executed (pickles are read by an
unpickler that refuses every global), and each one that cannot be read is a one-line
warning while the rest is analysed. Every reader here produces the typed records of
:mod:`ddptop.evidence.types`; :mod:`ddptop.evidence.fold` turns them into the same events a
recording holds, so the same model, diagnosis, dashboard and bundle serve them.
"""
