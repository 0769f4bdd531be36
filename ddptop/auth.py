"""Token handling and the challenge-response between viewers and ranks.

The token never travels: a rank sends a random nonce, the viewer answers with
HMAC-SHA256(token, nonce) and a nonce of its own, and the rank answers that one (domain
separated), so each side knows the other holds the token. Where the token comes from:
``DDPTOP_TOKEN`` / ``DDPTOP_TOKEN_FILE``, else the job's own (:mod:`ddptop.store.job_token`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from ddptop.errors import AuthError

TOKEN_ENV = "DDPTOP_TOKEN"
TOKEN_FILE_ENV = "DDPTOP_TOKEN_FILE"
MAX_TOKEN_FILE_BYTES = 4096  # a token is 64 hex digits; a file much larger is not one
LOOPBACK_BINDS = frozenset(("127.0.0.1", "::1", "localhost"))


def token_for_bind(bind: str, token: str | None) -> str | None:
    """The token a reporter bound to *bind* uses: loopback binds may go without one; any
    other bind without one is refused (AuthError), whoever set ``DDPTOP_BIND``."""
    if bind in LOOPBACK_BINDS or token:
        return token
    raise AuthError(f"binding to {bind} requires a token (set {TOKEN_ENV})")


def new_nonce() -> str:
    """Return a fresh random challenge (hex)."""
    return secrets.token_hex(16)


def prove(token: str, nonce: str) -> str:
    """Return the proof of knowing *token* for challenge *nonce*."""
    return hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def verify(token: str, nonce: str, mac: str) -> bool:
    """Check a proof in constant time."""
    return hmac.compare_digest(prove(token, nonce), mac)


def prove_server(token: str, nonce: str) -> str:
    """The rank's proof of knowing *token* for the viewer's challenge *nonce*.

    Domain-separated from :func:`prove`: a fake rank that hands a viewer the viewer's own
    nonce as its challenge gets nothing it can answer with."""
    return prove(token, "rank-proof:" + nonce)


def verify_server(token: str, nonce: str, mac: str) -> bool:
    """Check a rank's proof in constant time."""
    return hmac.compare_digest(prove_server(token, nonce), mac)


def load_token(explicit: str | None = None) -> str | None:
    """Find the token: an explicit value, then $DDPTOP_TOKEN, then $DDPTOP_TOKEN_FILE.

    A token file must not be readable by others (mode 0600), as with ssh keys.
    """
    if explicit:
        return explicit
    value = os.environ.get(TOKEN_ENV)
    if value:
        return value
    path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    file = Path(path)
    try:
        mode = file.stat().st_mode
    except OSError as exc:
        raise AuthError(f"cannot read token file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthError(f"token file {path} must be private (chmod 600), it is {oct(mode & 0o777)}")
    # The user's own file, named by them: a link is followed (Kubernetes mounts secrets as
    # links), but the read is capped, as every read of a file ddptop did not write.
    try:
        with open(file, "rb") as fh:
            data = fh.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise AuthError(f"cannot read token file {path}: {exc.strerror}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise AuthError(f"token file {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes: not a token")
    token = data.decode("utf-8", "replace").strip()
    if not token:
        raise AuthError(f"token file {path} is empty")
    return token
