"""What ddptop keeps on disk, and its safe readers and writers: the runtime directory (live
ranks) and the record directories of jobs (in it, or under ``$DDPTOP_RECORD_DIR``).

``discovery`` (the per-user runtime directory, each rank's ``<job>.<rank>.json`` discovery entry,
the capped, link-refusing reader and the atomic writer), ``remains`` (what a dead rank
leaves: last words, crash files, its progress page, stuck reports), ``progress_page`` (the
page's layout and its writer), ``job_token`` (each job's generated token), ``jobrecord``
(each job's record directory and its job record ``job.json``, listing and retention) and
``namespaces`` (runtime directories in other mount namespaces, through ``/proc/PID/root``).

Other rooms that write there (the node agent's recordings, through :mod:`ddptop.bundle`'s
writer) keep the same rules: mode 0600, never through a link, reads capped.

Standard library, msgspec and the shared modules below every room (:mod:`ddptop.protocol`,
:mod:`ddptop.rank_state`, :mod:`ddptop.auth`, :mod:`ddptop.errors`) only: ranks import this
room too, so it must never pull a viewer, textual or torch in.
"""
