"""The one launcher path (:func:`ddptop.agent.launcher.run_beside`) says what each verb always said.

``ddptop launch`` and ``python -m ddptop.agent`` share it; their words on stderr are a public
interface, so each voice is checked word for word: the endpoint served (the ranks told its
port), metrics refused on a port in use, and a job that cannot start (the record still closed).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ddptop.agent.launcher import LAUNCH_VOICE, SPAWNED_VOICE, AgentLaunch, Voice, run_beside
from ddptop.agent.node import NodeAgent
from ddptop.errors import UsageError
from ddptop.store import jobrecord


@pytest.mark.parametrize("voice", [LAUNCH_VOICE, SPAWNED_VOICE], ids=["launch", "spawned"])
def test_each_verb_keeps_its_words(runtime_dir: Path, capsys: pytest.CaptureFixture[str],
                                   voice: Voice) -> None:
    told: list[int] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        agent = NodeAgent("voice", ["train.py"], 0, record=False)
        launch = AgentLaunch(voice=voice, serve_on="127.0.0.1", on_serving=told.append,
                             metrics_on=("127.0.0.1", busy), grace_s=0)
        code, record = run_beside(agent, launch, lambda: 3)
    assert code == 3 and record.exit_code == 3 and record.end_time
    assert len(told) == 1 and told[0] > 0
    lines = capsys.readouterr().err.splitlines()
    refused = [line for line in lines if "metrics" in line]
    if voice is LAUNCH_VOICE:
        assert lines == refused  # the launcher does not announce its endpoint
        assert refused == [f"ddptop: no metrics: cannot listen on 127.0.0.1:{busy}: Address already in use"]
    else:
        assert lines[0] == f"ddptop agent: serving viewers on 127.0.0.1:{told[0]}"
        assert refused == [f"ddptop agent: no metrics on 127.0.0.1:{busy}: Address already in use"]


def test_a_job_that_cannot_start_still_closes_the_record(runtime_dir: Path) -> None:
    agent = NodeAgent("unstartable", ["nowhere"], 0, record=False)

    def cannot_start() -> int:
        raise UsageError("cannot start nowhere: No such file or directory")

    with pytest.raises(UsageError):
        run_beside(agent, AgentLaunch(voice=LAUNCH_VOICE), cannot_start)
    record = jobrecord.read_record("unstartable")
    assert record is not None and record.end_time and record.exit_code is None
