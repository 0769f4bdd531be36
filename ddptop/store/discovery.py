"""Where ranks announce themselves on a host, and how a viewer finds them.

Each rank writes one small JSON discovery entry into a per-user runtime directory (mode 0700):
``<job_id>.<rank>.json`` with host, port, pid, rank, world size and job id. The entry
is removed at clean exit; an entry whose pid is gone is stale and ignored (its crash
and last-words files beside it are kept for the post-mortem). Standard library only:
the reporter inside a rank imports this.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ddptop.errors import RuntimeDirError
from ddptop.store.proc_start import same_process

log = logging.getLogger(__name__)

RUNTIME_ENV = "DDPTOP_RUNTIME_DIR"
# Keys in the job's TCPStore: ranks publish under them (reporter.store_publish), viewers on
# other hosts read them (client.targets). Here so that neither side imports the other.
STORE_KEY_PREFIX = "ddptop/endpoint/"
STORE_WORLD_KEY = "ddptop/world_size"
AGENT_PORT_ENV = "DDPTOP_AGENT_PORT"  # set by `ddptop launch` for its ranks: its endpoint's port
_SAFE_JOB_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def is_safe_job_id(job_id: str) -> bool:
    """True if *job_id* can name files (no path separators, no leading dot, bounded)."""
    return bool(_SAFE_JOB_ID.match(job_id))


@dataclass(frozen=True)
class Endpoint:
    """How to reach one rank's reporter."""

    job_id: str
    rank: int
    world_size: int
    host: str
    port: int
    pid: int
    start_time: float = 0.0
    node: str = ""  # hostname the rank runs on (host may be an address)
    # Port of the node agent (``ddptop launch``) that serves this rank with the rest of its
    # node, at the same host; 0 when there is none (``ddptop.install()`` without a launcher).
    agent_port: int = 0
    # Added with #22 (older entries lack them): the job's TCPStore as "host:port", where every
    # rank published its endpoint (a viewer that finds some ranks here reads the rest there);
    # the scheduler's name of the job ("12345.0", SLURM's job.step) and the job's name there.
    store: str = ""
    scheduler_job: str = ""
    job_name: str = ""
    # Added with #49: the process's start in clock ticks since boot (/proc/PID/stat), so that
    # a later process with the same pid (a container restarted, pids wrapped) is not taken
    # for this rank; 0 in older entries and where /proc is not there.
    proc_start: int = 0

    @property
    def via_agent(self) -> tuple[str, int] | None:
        """Where the node agent that serves this rank listens, if one does."""
        return (self.host, self.agent_port) if self.agent_port else None

    def to_json(self) -> str:
        """Serialise for the discovery entry and the TCPStore."""
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str | bytes) -> Endpoint:
        """Parse a discovery entry; ValueError if it is not one."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("discovery entry is not an object")
        return Endpoint(
            job_id=str(data["job_id"]),
            rank=int(data["rank"]),
            world_size=int(data["world_size"]),
            host=str(data["host"]),
            port=int(data["port"]),
            pid=int(data["pid"]),
            start_time=float(data.get("start_time", 0.0)),
            node=str(data.get("node", "")),
            agent_port=int(data.get("agent_port", 0)),
            store=str(data.get("store", ""))[:300],
            scheduler_job=str(data.get("scheduler_job", ""))[:64],
            job_name=str(data.get("job_name", ""))[:200],
            proc_start=int(data.get("proc_start", 0)),
        )


_viewed_dir: Path | None = None


def view_runtime_dir(path: Path | None) -> None:
    """Make *path* this viewer's runtime directory (None: back to the usual one).

    A viewer that found its job only in another mount namespace's directory (seen through
    ``/proc/PID/root``, :mod:`ddptop.store.namespaces`) reads everything of the job there: the
    job's token, its last words, its black box. Never called in a rank or a node agent.
    """
    global _viewed_dir
    _viewed_dir = path


def runtime_dir(create: bool = True) -> Path:
    """Return the per-user runtime directory (created 0700 when *create*)."""
    if _viewed_dir is not None:
        return _viewed_dir
    explicit = os.environ.get(RUNTIME_ENV)
    if explicit:
        path = Path(explicit)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "ddptop"
    else:
        path = Path(tempfile.gettempdir()) / f"ddptop-{os.getuid()}"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_private_dir(path)
    return path


def check_private_dir(path: Path) -> None:
    """Make sure *path* is a real directory of ours with mode 0700, or raise RuntimeDirError.

    In a shared /tmp another user could create ``/tmp/ddptop-UID`` first, or a symlink
    there, and read or redirect everything ranks write: refuse such a directory.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"runtime directory {path} is not a directory (a symlink?): refusing it")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(f"runtime directory {path} belongs to uid {st.st_uid}, not to you: refusing it")
    if stat.S_IMODE(st.st_mode) != 0o700:
        # mkdir's mode is masked by umask and ignored for an existing dir: enforce it.
        os.chmod(path, 0o700)


def private_read(path: Path, limit: int) -> bytes | None:
    """At most *limit* bytes of *path*, never through a symlink; None if unreadable or larger."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def private_write(path: Path, data: bytes) -> None:
    """Write *data* to *path* atomically, mode 0600, never following a symlink."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def rank_file(job_id: str, rank: int, suffix: str = "json") -> Path:
    """Path of one of a rank's files in the runtime directory, ``<job>.<rank>.<suffix>``: its
    discovery entry (``json``), last words (``last``), crash file (``crash``), progress page
    (``page``) or the node agent's stuck report (``stuck``)."""
    return runtime_dir() / f"{job_id}.{rank}.{suffix}"


def write_entry(endpoint: Endpoint, directory: Path | None = None) -> Path:
    """Atomically write *endpoint*'s discovery entry (into *directory*, else the runtime dir)."""
    if directory is None:
        path = rank_file(endpoint.job_id, endpoint.rank)
    else:
        path = directory / f"{endpoint.job_id}.{endpoint.rank}.json"
    private_write(path, endpoint.to_json().encode())
    return path


def entry_alive(endpoint: Endpoint) -> bool:
    """True if the process that wrote *endpoint* still runs on this host: its pid is alive and
    is the same process (not a later one given the pid: :mod:`ddptop.store.proc_start`)."""
    return pid_alive(endpoint.pid) and same_process(endpoint.pid, endpoint.proc_start, endpoint.start_time)


# Ranks of one incarnation of a job start within seconds of each other (one launch, or one
# restart round of torchrun, which restarts every local worker together); an entry that
# started this long before the earliest live rank of its job id is of an earlier job.
INCARNATION_SPAN_S = 300.0


def earlier_incarnation(entry: Endpoint, live: list[Endpoint]) -> bool:
    """True if *entry*, whose process is gone, belongs to an earlier job that had the same id
    as the job whose ranks *live* run now (SLURM numbers jobs from 1 again on a rebuilt
    cluster, torchrun's default run id is shared, containers reuse names): it started well
    before them, or the job had another size. Such an entry is a record of that ended job,
    never a dead rank of this one."""
    if not live:
        return False
    if entry.world_size != max(e.world_size for e in live):
        return True
    starts = [e.start_time for e in live if e.start_time]
    return bool(entry.start_time and starts and entry.start_time < min(starts) - INCARNATION_SPAN_S)


def pid_alive(pid: int) -> bool:
    """True if a process with *pid* exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


MAX_ENTRY_BYTES = 64 * 1024
MAX_ENTRIES = 65536  # discovery entries read from one directory, at most


def entries_in(directory: Path) -> list[Endpoint]:
    """Every well-formed discovery entry in *directory* (capped reads, no symlinks), alive or not."""
    found: list[Endpoint] = []
    try:
        paths = sorted(directory.glob("*.json"))[:MAX_ENTRIES]
    except OSError:
        return []
    for path in paths:
        data = private_read(path, MAX_ENTRY_BYTES)
        try:
            if data is None:
                raise ValueError("unreadable, a symlink or too large")
            found.append(Endpoint.from_json(data))
        except (ValueError, KeyError, TypeError) as exc:
            log.debug("ignoring unreadable discovery entry %s: %s", path, exc)
    return found


def read_entries(include_stale: bool = False) -> list[Endpoint]:
    """All well-formed discovery entries in the runtime directory, live ones only by default."""
    directory = runtime_dir(create=False)
    if not directory.is_dir():
        return []
    return [e for e in entries_in(directory) if include_stale or entry_alive(e)]


def group_by_job(endpoints: list[Endpoint]) -> dict[str, list[Endpoint]]:
    """*endpoints* grouped by job id, each job's ranks sorted."""
    jobs: dict[str, list[Endpoint]] = {}
    for endpoint in endpoints:
        jobs.setdefault(endpoint.job_id, []).append(endpoint)
    for ranks in jobs.values():
        ranks.sort(key=lambda e: e.rank)
    return jobs


def jobs_on_host(include_stale: bool = False) -> dict[str, list[Endpoint]]:
    """Discovery entries grouped by job id, each job's ranks sorted."""
    return group_by_job(read_entries(include_stale))


AGENT_SUFFIX = "agent"  # <job>.agent: "PORT PID" of a node agent that ranks did not start knowing


def write_agent_port(job_id: str, port: int) -> Path:
    """Say where this host's node agent of *job_id* serves (``python -m ddptop.agent
    --serve``, spawned by a rank after the ranks started): ranks read it and name it."""
    path = runtime_dir() / f"{job_id}.{AGENT_SUFFIX}"
    private_write(path, f"{int(port)} {os.getpid()}".encode())
    return path


def read_agent_port(job_id: str) -> int:
    """The port of this host's live node agent of *job_id* from its file (0 if none)."""
    data = private_read(runtime_dir(create=False) / f"{job_id}.{AGENT_SUFFIX}", 64)
    try:
        port, pid = (int(x) for x in (data or b"").split())
    except ValueError:
        return 0
    return port if 0 < port < 65536 and pid_alive(pid) else 0
