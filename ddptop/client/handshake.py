"""The viewer's side of the handshake, without I/O: one state machine for every client.

:class:`~ddptop.client.live.LiveSource` (a selector over many peers, what every verb uses)
and the tests' blocking client of one rank (``tests/rank_connection.py``) feed it the rank's ``Hello``
and ``AuthResult`` and send what it returns; every refusal is an :class:`AuthError` whose
words the summaries (:func:`ddptop.client.collect.unreachable_summary`) recognise.

What it checks, in order: a rank that asks for a token gets our proof and a challenge of
ours, and must answer the challenge (it knows the token too); a rank that asks for none is
accepted unless the job has a token of its own on this host, which every one of its ranks
would ask for (:mod:`ddptop.store.job_token`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ddptop import auth
from ddptop.errors import AuthError
from ddptop.protocol import AGENT_HELLO_RANK, AuthProof, AuthResult, Hello
from ddptop.store import job_token
from ddptop.store.discovery import Endpoint

# How a refusal reads (summaries tell "refused" from "not answering" by these words).
TOKEN_MISSING = "requires a token"
TOKEN_REFUSED = "refused the token"
NOT_THE_RANK = "did not prove it knows the job's token"
MISSING_RECHECK_S = 1.0  # a job with no token file is looked for again after this long


class JobTokens:
    """Each job's token for one viewer: the job's own file on this host, read once, else the
    environment's *fallback* (:func:`ddptop.store.job_token.for_viewer`'s rule).

    A viewer of 4,096 node agents shook hands 4,096 times at an attach, and read the same file
    each time (a tenth of its attach's CPU). A token found is kept. A job without one is looked
    for again once :data:`MISSING_RECHECK_S` passed since the last look (by *clock*), so a token
    the job makes after the viewer started is found at a handshake a second later, and the
    4,096 handshakes of one attach look once (a job with no token file: the synthetic job's,
    ranks started without ``ddptop launch``), not 4,096 times (8 % of the viewer's attach CPU).
    """

    def __init__(self, fallback: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.fallback = fallback
        self._clock = clock
        self._found: dict[str, str] = {}
        self._missing: dict[str, float] = {}  # job id -> when its file was last found missing

    def for_job(self, job_id: str) -> tuple[str | None, bool]:
        """The token to prove to *job_id*'s ranks, and whether it is the job's own."""
        own = self._found.get(job_id)
        if own is None:
            now = self._clock()
            looked = self._missing.get(job_id)
            if looked is not None and now - looked < MISSING_RECHECK_S:
                return self.fallback, False
            own = job_token.read(job_id)
            if not own:
                self._missing[job_id] = now
                return self.fallback, False
            self._missing.pop(job_id, None)
            self._found[job_id] = own
        return own, True


class Handshake:
    """One connection's handshake with the rank at *endpoint*.

    *token* is the environment's (``auth.load_token()``); the job's own token file on this
    host, when there is one, wins (:func:`ddptop.store.job_token.for_viewer`). A viewer of many
    peers passes its :class:`JobTokens` instead, which reads that file once."""

    def __init__(self, endpoint: Endpoint, token: str | JobTokens | None) -> None:
        who = "node agent" if endpoint.rank == AGENT_HELLO_RANK else f"rank {endpoint.rank}"
        self.label = f"{who} at {endpoint.host}:{endpoint.port}"
        tokens = token if isinstance(token, JobTokens) else JobTokens(token)
        self._token, self._job_owns_token = tokens.for_job(endpoint.job_id)
        self._challenge = ""
        self.hello: Hello | None = None
        self.done = False

    def on_hello(self, hello: Hello) -> AuthProof | None:
        """The proof to send, or None when the rank asks for none (then the handshake is done)."""
        self.hello = hello
        if hello.auth_required:
            if not self._token:
                raise AuthError(f"{self.label} {TOKEN_MISSING} (set {auth.TOKEN_ENV})")
            self._challenge = auth.new_nonce()
            return AuthProof(mac=auth.prove(self._token, hello.nonce), nonce=self._challenge)
        if self._job_owns_token:  # every rank of this job asks for its token: not one of them
            raise AuthError(f"{self.label} {NOT_THE_RANK} (it asked for none): not the job's rank")
        self.done = True
        return None

    def on_result(self, result: AuthResult) -> None:
        """The rank's verdict on our proof, with its own proof; AuthError unless both hold."""
        if not result.ok:
            raise AuthError(f"{self.label} {TOKEN_REFUSED}: {result.reason}")
        if not self._token or not self._challenge or not auth.verify_server(self._token, self._challenge,
                                                                             result.mac):
            raise AuthError(f"{self.label} {NOT_THE_RANK}: not the job's rank")
        self.done = True
