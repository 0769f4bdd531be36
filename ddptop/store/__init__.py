"""What lies on disk in the runtime directory, and its safe readers and writers.

``discovery`` (the per-user runtime directory, each rank's ``<job>.<rank>.json`` record,
the capped, link-refusing reader and the atomic writer), ``remains`` (what a dead rank
leaves: last words, crash files, its progress page, stuck reports), ``progress_page`` (the
page's layout and its writer), ``job_token`` (each job's generated token), ``jobrecord``
(an ended job's ``job.json``, listing and retention) and ``namespaces`` (runtime
directories in other mount namespaces, through ``/proc/PID/root``).

Other rooms that write there (the node agent's recordings, through :mod:`ddptop.bundle`'s
writer) keep the same rules: mode 0600, never through a link, reads capped.

Standard library, msgspec and :mod:`ddptop.protocol` only: ranks import this room too, so
it must never pull a viewer, textual or torch in.
"""
