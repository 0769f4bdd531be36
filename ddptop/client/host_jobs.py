"""The jobs on this host, wherever their ranks wrote their discovery entries (#22).

First the viewer's own runtime directory; then, for a job that is not there, the runtime
directories of processes in other mount namespaces (a private /tmp: SLURM's
``job_container/tmpfs``, a container), read through ``/proc/PID/root``
(:mod:`ddptop.store.namespaces`). Records in a namespace whose network is not ours are kept
apart: that is another host as far as the job is concerned (a container with its own
network, a simulated node), whose ranks' loopback ports cannot be reached from here;
:func:`where_we_looked` says what to do instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptop.store import discovery, namespaces
from ddptop.store.discovery import Endpoint
from ddptop.store.jobrecord import JobRecord
from ddptop.store.namespaces import HiddenDir


@dataclass
class HostJobs:
    """Every job with discovery entries on this host: its live ranks, all its ranks, and where."""

    live: dict[str, list[Endpoint]]
    every: dict[str, list[Endpoint]]
    hidden: dict[str, HiddenDir] = field(default_factory=dict)  # job -> the directory it was found in
    other_network: dict[str, HiddenDir] = field(default_factory=dict)  # jobs whose ports are not ours
    looked_into: int = 0  # other mount namespaces' directories read
    # job -> entries of an earlier, ended job that had the same id as a live one (#49)
    earlier: dict[str, list[Endpoint]] = field(default_factory=dict)

    def use(self, job_id: str) -> None:
        """Read the rest of *job_id* (its token, last words, recording) where its discovery entries are."""
        if job_id in self.hidden:
            discovery.view_runtime_dir(self.hidden[job_id].path)


def scan(elsewhere: bool = True) -> HostJobs:
    """The jobs of our runtime directory and, with *elsewhere*, of other mount namespaces'.

    Live beats stale (#49): an entry whose process is gone never hides a live rank of the
    same job id found elsewhere, and one of an earlier job that had the id
    (:func:`discovery.earlier_incarnation`) is not made a dead rank of the live job; such
    entries are kept apart in ``earlier`` (the record of an ended job, for ``ddptop jobs``).
    """
    own = discovery.runtime_dir(create=False)
    every = discovery.jobs_on_host(include_stale=True)
    live = {job: [e for e in ranks if discovery.entry_alive(e)] for job, ranks in every.items()}
    found = HostJobs(live={job: ranks for job, ranks in live.items() if ranks}, every=every)
    if elsewhere:
        for hidden in namespaces.hidden_runtime_dirs(own if own.is_dir() else None):
            found.looked_into += 1
            _add_hidden(found, hidden)
    _set_apart_earlier(found)
    return found


def _add_hidden(found: HostJobs, hidden: HiddenDir) -> None:
    """The jobs of one other mount namespace's runtime directory, where ours has no live rank of them."""
    for job_id, ranks in discovery.group_by_job(discovery.entries_in(hidden.path)).items():
        if job_id in found.live and job_id not in found.hidden:
            continue  # our own directory's live ranks win
        alive = [e for e in ranks if hidden.alive(e.pid, e.proc_start)]
        if alive and job_id not in found.hidden and job_id in found.every:
            # Our directory held only an ended job of that id: its record, not this job's ranks.
            found.earlier[job_id] = found.every.pop(job_id)
        if not hidden.same_network:
            found.other_network.setdefault(job_id, hidden)
            continue
        if not alive and job_id in found.every and job_id not in found.hidden:
            continue  # only stale here too: our own directory's record of the job stands
        # Ranks of one job may sit in several namespaces (a container per GPU): all of them,
        # a live rank's entry before a stale one of the same rank.
        live_before = found.live.get(job_id, [])
        merged = {e.rank: e for e in found.every.get(job_id, [])}
        for entry in ranks:
            held = merged.get(entry.rank)
            if held is None or (entry in alive and held not in live_before):
                merged[entry.rank] = entry
        found.hidden.setdefault(job_id, hidden)
        found.every[job_id] = sorted(merged.values(), key=lambda e: e.rank)
        now_live = [e for e in found.every[job_id] if e in live_before or e in alive]
        if now_live:
            found.live[job_id] = now_live


def _set_apart_earlier(found: HostJobs) -> None:
    for job_id, live in found.live.items():
        ranks = found.every.get(job_id, [])
        earlier = [e for e in ranks if e not in live and discovery.earlier_incarnation(e, live)]
        if earlier:
            found.earlier[job_id] = found.earlier.get(job_id, []) + earlier
            found.every[job_id] = [e for e in ranks if e not in earlier]


def record_of_earlier_job(record: JobRecord | None, live: list[Endpoint]) -> bool:
    """True if *record* (a job record of the id of the job whose ranks *live* run) closed
    before any of them started: the record of an earlier job that had the id (#49)."""
    starts = [e.start_time for e in live if e.start_time]
    return bool(record is not None and record.end_time and starts and record.end_time < min(starts))


def where_we_looked(found: HostJobs, target: str = "") -> str:
    """Where this viewer looked for jobs, and why some it saw cannot be watched from here.

    Of the jobs seen in another network namespace, the one asked for (*target*, an id or its
    prefix) is named; else the first by id."""
    text = f"looked in {discovery.runtime_dir(False)}"
    if found.looked_into:
        text += f" and in {found.looked_into} private /tmp of other mount namespaces (through /proc/PID/root)"
    if found.other_network:
        seen = sorted(found.other_network.items())
        asked = [item for item in seen if item[0] == target] or [item for item in seen if target and
                                                                    item[0].startswith(target)]
        job_id, hidden = (asked or seen)[0]
        text += (f"; job {job_id} runs in another network namespace (pid {hidden.pid}'s), its ranks on "
                 f"its own loopback: watch it from inside (`nsenter -t {hidden.pid} -n -m ddptop attach`, "
                 "`docker exec`, `kubectl exec`)")
    return text
