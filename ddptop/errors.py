"""One error hierarchy for ddptop, mapped to process exit codes in one place.

Every error a user can cause (a bad target, an unreadable bundle, a rank that does not
answer) is a :class:`DdptopError`. The CLI catches exactly this hierarchy, prints its
one-line message and exits with :func:`exit_code_for`; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations


class DdptopError(Exception):
    """Base of every error ddptop reports to a user as a one-line message."""

    exit_code = 2


class UsageError(DdptopError):
    """The command line itself is wrong (bad flag combination, bad value)."""

    exit_code = 2


class TargetNotFound(DdptopError):
    """No job matched the requested target (nothing on this host, unknown job id)."""

    exit_code = 2


class RankUnreachable(DdptopError):
    """Some ranks of a job did not answer; what did answer was still shown."""

    exit_code = 3


class ProtocolError(DdptopError):
    """A peer or a file spoke something that is not the ddptop wire protocol."""

    exit_code = 2


class AuthError(ProtocolError):
    """Challenge-response with a rank failed (missing or wrong token)."""

    exit_code = 2


class BundleError(DdptopError):
    """A recording or bundle file is missing, truncated, corrupt or hostile."""

    exit_code = 2


class EvidenceError(BundleError):
    """A file of evidence from elsewhere (a Flight Recorder dump, a log) is unreadable or hostile."""

    exit_code = 2


class RuntimeDirError(DdptopError, OSError):
    """The runtime directory is not safe to use (a symlink, another user's, unwritable).

    Also an OSError, so code that degrades on file-system trouble (the reporter in a rank)
    treats it like any other I/O failure."""

    exit_code = 2


class FindingsPresent(DdptopError):
    """`ddptop doctor` found something of warning severity or worse (exit 1)."""

    exit_code = 1


def exit_code_for(error: BaseException) -> int:
    """Return the process exit code for *error* (2 for anything unexpected)."""
    if isinstance(error, DdptopError):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return 130
    return 2
