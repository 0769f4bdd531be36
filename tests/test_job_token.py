"""Every job gets a token: same-user viewers need no setup, anyone else is refused, and a
viewer refuses a "rank" that cannot prove it knows the token.

Real files in a private runtime directory, real ``ReporterServer``s and a hand-made impostor
on loopback, and a real 2-rank job under ``ddptop launch`` viewed by the same user, by a
process without the token and by another local user (``nobody``, through ``setpriv``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddptop import auth
from ddptop.client.handshake import NOT_THE_RANK, TOKEN_MISSING
from ddptop.errors import AuthError
from ddptop.protocol import PROTOCOL_VERSION, AuthResult, Hello
from ddptop.store import discovery, job_token
from ddptop.store.discovery import Endpoint
from ddptop.wire import FrameBuffer, encode_frame, header_bytes
from tests.jobs import ROOT, JobRunner, ddptop_cmd
from tests.rank_connection import RankConnection
from tests.servers import serving


def test_a_job_token_is_made_once_private_and_shared(runtime_dir: Path) -> None:
    token = job_token.ensure("jt1")
    path = job_token.path_for("jt1")
    assert len(token) == 64 and (path.stat().st_mode & 0o777) == 0o600
    assert job_token.ensure("jt1") == token == job_token.read("jt1")
    # Eight processes race for one job's token: they all end up with the same one.
    code = "from ddptop.store import job_token; print(job_token.ensure('jt2'))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(8)]
    outs = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(outs) == 1 and outs == {job_token.read("jt2")}
    assert not [p.name for p in runtime_dir.iterdir() if p.name.startswith(".")]  # no temp left behind
    job_token.remove("jt1")
    assert job_token.read("jt1") is None


def test_a_token_file_that_is_not_ours_and_private_is_no_token(runtime_dir: Path) -> None:
    job_token.path_for("open").write_text("x" * 64)
    job_token.path_for("open").chmod(0o644)
    assert job_token.read("open") is None
    (runtime_dir / "elsewhere").write_text("y" * 64)
    job_token.path_for("link").symlink_to(runtime_dir / "elsewhere")
    assert job_token.read("link") is None
    with pytest.raises(OSError):
        job_token.ensure("link")  # never follows, never replaces
    assert job_token.read("../x") is None


@contextmanager
def impostor(ask_token: bool) -> Iterator[int]:
    """A listener that speaks the handshake without knowing any token; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                hello = Hello(protocol=PROTOCOL_VERSION, role="rank", rank=0, job_id="jimp",
                              nonce="ab" * 16 if ask_token else "", auth_required=ask_token)
                conn.sendall(header_bytes() + encode_frame(hello))
                buf = FrameBuffer()
                try:
                    while ask_token and not buf.feed(conn.recv(65536)):
                        pass
                    if ask_token:  # "ok", with no proof of its own
                        conn.sendall(encode_frame(AuthResult(ok=True)))
                    conn.recv(65536)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_the_viewer_refuses_a_rank_that_cannot_prove_the_token(runtime_dir: Path) -> None:
    job_token.ensure("jimp")
    for asks in (True, False):  # says "ok" without a proof; or asks for no token at all
        with impostor(asks) as port:
            endpoint = Endpoint(job_id="jimp", rank=0, world_size=1, host="127.0.0.1", port=port, pid=1)
            with pytest.raises(AuthError, match=NOT_THE_RANK):
                RankConnection(endpoint, timeout=5).open()
    # A real server with the job's token proves it; one with another token refuses us.
    with serving(token=job_token.read("jimp"), job_id="jimp") as srv, \
            RankConnection(srv.endpoint, timeout=5) as conn:
        assert conn.state().state.rank == srv.endpoint.rank
    with serving(token="another-token", job_id="jimp") as srv, pytest.raises(AuthError, match="refused"):
        RankConnection(srv.endpoint, timeout=5).open()


def _nobody_can_run_python() -> str:
    if os.geteuid() != 0:
        return "needs root to run a process as another user"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                          "-c", "import ddptop"], capture_output=True, text=True, timeout=60, check=False,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    return "" if res.returncode == 0 else f"user nobody cannot run this Python: {res.stderr.strip()[-200:]}"


@pytest.mark.slow
def test_a_job_is_safe_by_default_even_on_one_host(job_runner: JobRunner, tmp_path: Path) -> None:
    job = job_runner.start("healthy", nproc=2, env={"PROBE_SECONDS": "60"})
    job.wait_ranks(2, timeout=90)  # the same user, no DDPTOP_TOKEN anywhere: it just works
    token_file = job_token.path_for(job.job_id)
    assert (token_file.stat().st_mode & 0o777) == 0o600
    endpoint = next(e for e in discovery.read_entries() if e.job_id == job.job_id and e.rank == 0)
    probe = ("import sys; from tests.rank_connection import RankConnection; "
             "from ddptop.store.discovery import Endpoint; from ddptop.errors import AuthError\n"
             f"e = Endpoint(job_id={job.job_id!r}, rank=0, world_size=2, host='127.0.0.1', "
             f"port={endpoint.port}, pid=1)\n"
             "try:\n    RankConnection(e, timeout=5).open()\n"
             "except AuthError as exc:\n    print(exc); sys.exit(7)\n"
             "print('served'); sys.exit(0)\n")
    # A process of this user that did not read the job's token (another runtime dir): refused.
    elsewhere = tmp_path / "other-rt"
    elsewhere.mkdir(mode=0o700)
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         check=False, env={**job.env, "DDPTOP_RUNTIME_DIR": str(elsewhere)})
    assert res.returncode == 7 and TOKEN_MISSING in res.stdout, (res.stdout, res.stderr)
    # Another local user cannot read the token, and the rank refuses it.
    why_not = _nobody_can_run_python()
    if why_not:
        pytest.skip(f"refusal of another user not checked: {why_not}")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DDPTOP_RUNTIME_DIR": str(job.runtime_dir)}
    peek = subprocess.run([*as_nobody, "-c", f"open({str(token_file)!r}).read()"], capture_output=True,
                          text=True, timeout=60, check=False, env=env)
    assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek.stderr
    res = subprocess.run([*as_nobody, "-c", probe], capture_output=True, text=True, timeout=60, check=False,
                         env=env)
    assert res.returncode == 7 and TOKEN_MISSING in res.stdout, (res.stdout, res.stderr)
    # ... while the same user's viewer is served, with no setup at all.
    snap = json.loads(job.run_cli("snapshot", "--json", job.job_id).stdout)
    assert sorted(r["rank"] for r in snap["ranks"]) == [0, 1]
    assert auth.load_token() is None and "DDPTOP_TOKEN" not in job.env


def test_launch_makes_the_token_before_the_ranks_and_removes_it_after(job_runner: JobRunner) -> None:
    env = job_runner.env()
    path = job_token.path_for("jtend")
    check = f"import os, stat; print(oct(os.stat({str(path)!r}).st_mode & 0o777))"
    res = subprocess.run(ddptop_cmd("launch", "--job-id", "jtend", "--", sys.executable, "-c", check),
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "0o600", (res.stdout, res.stderr)
    assert not path.exists()
    # With DDPTOP_TOKEN set (multi-node), that token is the job's: no file is made.
    exists = f"import os; print(os.path.exists({str(job_token.path_for('jtenv'))!r}))"
    res = subprocess.run(ddptop_cmd("launch", "--job-id", "jtenv", "--", sys.executable, "-c", exists),
                         env={**env, "DDPTOP_TOKEN": "shared"}, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0 and res.stdout.strip() == "False", (res.stdout, res.stderr)


def test_a_viewers_job_tokens_read_a_found_file_once_and_look_again_for_a_missing_one(
        runtime_dir: Path) -> None:
    """A viewer of thousands of node agents reads the job's token file once, not per handshake;
    a job that had no file when the viewer last looked is looked for again once a second has
    passed (a job that starts after its viewer makes its token then), not at every handshake."""
    from ddptop.client.handshake import MISSING_RECHECK_S, JobTokens

    now = [100.0]
    tokens = JobTokens("from-env", clock=lambda: now[0])
    assert tokens.for_job("late") == ("from-env", False)  # no file yet: the environment's
    made = job_token.ensure("late")
    now[0] += MISSING_RECHECK_S / 2
    assert tokens.for_job("late") == ("from-env", False)  # the same attach: not looked for again
    now[0] += MISSING_RECHECK_S / 2
    assert tokens.for_job("late") == (made, True)  # a second later: looked for again, and found
    job_token.path_for("late").unlink()
    now[0] += 10 * MISSING_RECHECK_S
    assert tokens.for_job("late") == (made, True)  # kept: the file is not read at each handshake
    assert JobTokens(None).for_job("late") == (None, False)  # a new viewer reads the file anew
