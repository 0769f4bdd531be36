"""A rank's ``sys.exit`` in its last words: the status it exits with and its message (#45).

Python exits on a ``SystemExit`` without ``sys.excepthook`` and without ``sys.last_value``: at
exit, ``sys.exit("rank 2: bad shard 7")`` (status 1) looked like the end of the script, and
doctor said the rank "exited cleanly". Real processes, each a rank started by
``ddptop.install()`` (no node agent: ``DDPTOP_AGENT_PID`` set, as under ``ddptop launch``), and
the last words each leaves in its runtime directory, read as a viewer reads them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddptop.protocol import RankState
from ddptop.status import Status
from ddptop.store import remains
from ddptop.store.discovery import runtime_dir

PROLOGUE = "import sys, threading, ddptop\nassert ddptop.install()\n"
CASES = {
    # name: (the rank's code, its exit status, status word, exit_code in the last words, reason)
    "message": ("sys.exit('rank 2: bad shard 7')", 1, Status.CRASHED, 1, "SystemExit('rank 2: bad shard 7')"),
    "code": ("sys.exit(3)", 3, Status.CRASHED, 3, "SystemExit(3)"),
    "zero": ("sys.exit()", 0, Status.EXITED, 0, ""),
    # A thread's sys.exit ends only that thread: not the rank's exit.
    "thread": ("t = threading.Thread(target=sys.exit, args=(5,)); t.start(); t.join()", 0, Status.EXITED,
               None, ""),
    # Caught and replaced: the exception the rank died of is its word, not the exit it asked for.
    "caught": ("try:\n    sys.exit(4)\nexcept SystemExit:\n    raise ValueError('after all')", 1,
               Status.CRASHED, None, "SystemExit: 4 (raised as ValueError: after all)"),
    # No function of ours sees a bare raise: only the node agent reads its status (from outside).
    "raised": ("raise SystemExit('bad shard 7')", 1, Status.EXITED, None, ""),
}


def _last_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                code: str) -> tuple[int, RankState]:
    rt = tmp_path / name
    rt.mkdir(mode=0o700)
    monkeypatch.setenv("DDPTOP_RUNTIME_DIR", str(rt))  # the rank's, and ours to read its words
    env = {**os.environ, "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "DDPTOP_JOB_ID": f"exit-{name}",
           "DDPTOP_AGENT_PID": "none"}
    res = subprocess.run([sys.executable, "-c", PROLOGUE + code], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert runtime_dir(False) == rt
    state = remains.read_last_state(f"exit-{name}", 2)
    assert state is not None, res.stderr
    return res.returncode, state


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_last_words_carry_sys_exits_status_and_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           name: str) -> None:
    code, status, word, exit_code, reason = CASES[name]
    returned, state = _last_words(tmp_path, monkeypatch, name, code)
    assert returned == status
    assert (state.status, state.exit_code) == (word, exit_code), state.exit_reason
    first, _, rest = state.exit_reason.partition("\n")
    assert first.startswith(reason) if reason else not first, state.exit_reason
    if exit_code:  # where sys.exit was called, for the person
        assert rest.strip() == "sys.exit at <string>:3 in <module>", state.exit_reason
