"""One way to run a node agent beside a job: ``ddptop launch`` and ``python -m ddptop.agent``.

``ddptop launch`` (:mod:`ddptop.cli.launch`) runs the job's command as its child;
``python -m ddptop.agent`` (:mod:`ddptop.agent.__main__`), spawned by ``ddptop.install()``,
waits for ranks it did not start. Around that wait both do the same, here, in
:func:`run_beside`: start the agent, open the node's endpoint for viewers (with the job's
token; the ranks are told its port), serve metrics when asked, then close the job record and drop
the job's token once the job is over. Only their words on stderr differ (:class:`Voice`),
and those are a public interface: kept as each verb always said them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ddptop import auth
from ddptop.agent.node import NodeAgent
from ddptop.errors import DdptopError
from ddptop.store import job_token
from ddptop.store.jobrecord import JobRecord

Code = TypeVar("Code", bound="int | None")  # a job's exit code: a command's, or none (a spawned agent)


@dataclass(frozen=True)
class Voice:
    """What a verb says on stderr about the agent's endpoint and metrics (``str.format``
    templates; an empty one says nothing)."""

    serving: str  # {bind} {port}
    not_serving: str  # {bind} {error}
    metrics: str  # {url}
    no_metrics: str  # {host} {port} {error}


LAUNCH_VOICE = Voice(serving="",
                     not_serving="ddptop: no node endpoint on {bind}: {error}; viewers connect to each rank",
                     metrics="ddptop: metrics at {url}",
                     no_metrics="ddptop: no metrics: cannot listen on {host}:{port}: {error}")
SPAWNED_VOICE = Voice(serving="ddptop agent: serving viewers on {bind}:{port}",
                      not_serving="ddptop agent: not serving viewers: {error}",
                      metrics="ddptop agent: metrics at {url}",
                      no_metrics="ddptop agent: no metrics on {host}:{port}: {error}")


@dataclass(frozen=True)
class AgentLaunch:
    """How to run an agent beside a job."""

    voice: Voice
    serve_on: str = ""  # the address of the node's endpoint for viewers ("": none)
    # Tells the ranks the endpoint's port (the launcher: in their environment; a spawned agent:
    # in the runtime directory). An OSError here counts as not serving.
    on_serving: Callable[[int], None] = lambda port: None
    metrics_on: tuple[str, int] | None = None  # where to serve Prometheus metrics (None: not)
    grace_s: float = 5.0  # how long the ranks' exits are waited for once the job is over


def run_beside(agent: NodeAgent, launch: AgentLaunch, job: Callable[[], Code]) -> tuple[Code, JobRecord]:
    """Run *job* (it returns the job's exit code, None if it has none) with *agent* watching,
    then close the job record: the exit code and the job record as closed. If *job* raises, it
    is closed at once (no grace) and the exception goes on."""
    agent.start()
    if launch.serve_on:
        _serve(agent, launch)
    if launch.metrics_on is not None:
        _serve_metrics(agent, launch.metrics_on, launch.voice)
    ended: list[Code] = []  # the job's exit code, once it ended by itself
    try:
        ended.append(job())
    finally:
        code = ended[0] if ended else None
        record = agent.finish(code, grace_s=launch.grace_s if ended else 0.0)
        job_token.remove(agent.job_id)  # its ranks are gone; what they left needs no token
    return ended[0], record


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _serve(agent: NodeAgent, launch: AgentLaunch) -> None:
    """Open the node's one endpoint for viewers where the ranks serve, with their token, and
    tell the ranks its port (they publish it beside their own)."""
    bind = launch.serve_on
    try:
        token = job_token.for_serving(bind, agent.job_id, auth.load_token())
        port = agent.serve(bind, token)
        launch.on_serving(port)
    except (OSError, DdptopError) as exc:  # viewers then reach each rank directly, as before
        _say(launch.voice.not_serving.format(bind=bind, error=exc))
        return
    if launch.voice.serving:
        _say(launch.voice.serving.format(bind=bind, port=port))


def _serve_metrics(agent: NodeAgent, listen: tuple[str, int], voice: Voice) -> None:
    # Like the recording: a port in use costs the metrics, never the job.
    try:
        _say(voice.metrics.format(url=agent.serve_metrics(listen)))
    except OSError as exc:
        _say(voice.no_metrics.format(host=listen[0], port=listen[1], error=exc.strerror or exc))
