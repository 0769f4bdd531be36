"""ddptop's Python API: what the command line's ``--json`` prints, as typed values.

For a notebook, a CI check or a scheduler's epilogue that wants the findings of a job, or
every rank's state, without parsing a terminal's output::

    from ddptop import api

    report = api.diagnose("path/to/fr_dumps")      # a job id, MASTER_ADDR:PORT, or what a job left
    for finding in report.findings:
        print(finding.severity, finding.kind, finding.title)

Each function is the verb of the same name without its printing: ``jobs`` is ``ddptop jobs
--json``, ``snapshot`` is ``ddptop snapshot --json``, ``diagnose`` is ``ddptop doctor --json``,
``export`` is ``ddptop export``; ``read_evidence`` and ``watch`` are what ``doctor`` on files
and the dashboard do. Every error is a :class:`DdptopError` with a one-line message (its
``exit_code`` is the command line's). The names in ``__all__`` are a public interface: they
are added to, never renamed. Reference: docs/api.md.

The dashboard and the verbs call this module; it reads, and changes nothing in the job (no
signal reaches a rank). It needs no torch, except to read a job's TCPStore (``HOST:PORT``).
"""

from __future__ import annotations

from ddptop.api.jobs import JobEntry, OutcomeEntry, jobs
from ddptop.api.looking import Evidence, Update, diagnose, export, read_evidence, snapshot, watch
from ddptop.api.targets import Target
from ddptop.client.capture import ExportSummary
from ddptop.diagnosis.finding import Finding, FindingsReport
from ddptop.errors import DdptopError
from ddptop.model.snapshot import JobSnapshot
from ddptop.protocol import RankState

__all__ = [
    "DdptopError", "Evidence", "ExportSummary", "Finding", "FindingsReport", "JobEntry", "JobSnapshot",
    "OutcomeEntry", "RankState", "Target", "Update", "diagnose", "export", "jobs", "read_evidence",
    "snapshot", "watch",
]
