"""Every job gets a token: safe by default, even on one host.

A rank's port on loopback answers anything on the host; the runtime directory's 0700
protects the discovery entries, not the port. So a job without ``DDPTOP_TOKEN`` gets one of
its own: ``<runtime dir>/<job>.token``, mode 0600, created by whichever comes first of
``ddptop launch`` and the job's ranks on the host (atomically: a rank that loses the race
reads the winner's). Every rank of the job on the host serves with it; viewers of the same
user read it from the same place, so they need no setup; anyone else — another user, who
cannot read the file, or a process that never looked — is refused at the handshake.

Viewers also check the server: a job whose token file exists must prove it knows the
token (see :mod:`ddptop.auth`), so a process that grabbed a port cannot pose as a rank.

``DDPTOP_TOKEN`` (or ``DDPTOP_TOKEN_FILE``) still wins when set: multi-node jobs share one
token across hosts that way, and no file is written for it.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ddptop import auth
from ddptop.store import discovery

SUFFIX = "token"
MAX_TOKEN_BYTES = 256


def path_for(job_id: str, create: bool = True) -> Path:
    """Where the job's generated token lives on this host."""
    return discovery.runtime_dir(create=create) / f"{job_id}.{SUFFIX}"


def read(job_id: str) -> str | None:
    """The job's generated token, if this host has one that is ours and private."""
    if not job_id or not discovery.is_safe_job_id(job_id):
        return None
    try:
        path = path_for(job_id, create=False)  # a viewer looking must not create the directory
        info = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None  # a symlink, another user's file or a readable one is no token of ours
    data = discovery.private_read(path, MAX_TOKEN_BYTES)
    token = data.decode(errors="replace").strip() if data else ""
    return token or None


def for_serving(bind: str, job_id: str, explicit: str | None, *, make: bool = False) -> str | None:
    """The token a server of *job_id* bound to *bind* serves with: the one rule for ranks,
    node agents and ``ddptop launch``. ``DDPTOP_TOKEN`` (*explicit*) when set; else, on
    loopback, the job's generated token (made now with *make*, as a rank does; OSError if
    impossible); beyond loopback without *explicit*, AuthError: a generated token never
    leaves this host, and an open port without a token is never served."""
    if explicit or bind not in auth.LOOPBACK_BINDS:
        return auth.token_for_bind(bind, explicit)
    return ensure(job_id) if make else read(job_id)


def ensure(job_id: str) -> str:
    """The job's token on this host, generated now if nobody did yet (OSError if impossible)."""
    existing = read(job_id)
    if existing:
        return existing
    if not discovery.is_safe_job_id(job_id):
        raise OSError(f"not a job id: {job_id[:40]!r}")
    path = path_for(job_id)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # never replaces: the first writer wins, whole
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    token = read(job_id)
    if token is None:
        raise OSError(f"{path} exists but is not a private token file of this user")
    return token


def remove(job_id: str) -> None:
    """Forget the job's token (its ranks are gone)."""
    try:
        path_for(job_id, create=False).unlink(missing_ok=True)
    except OSError:
        pass


def for_viewer(job_id: str, fallback: str | None) -> tuple[str | None, bool]:
    """The token to prove to the job's ranks, and whether it is the job's own (then a rank
    that does not ask for it is not the job's). The job's file wins over *fallback* (the
    environment's token), which is how multi-node jobs and older jobs are reached."""
    own = read(job_id)
    return (own, True) if own else (fallback, False)
