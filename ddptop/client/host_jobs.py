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
from ddptop.store.namespaces import HiddenDir


@dataclass
class HostJobs:
    """Every job with discovery entries on this host: its live ranks, all its ranks, and where."""

    live: dict[str, list[Endpoint]]
    every: dict[str, list[Endpoint]]
    hidden: dict[str, HiddenDir] = field(default_factory=dict)  # job -> the directory it was found in
    other_network: dict[str, HiddenDir] = field(default_factory=dict)  # jobs whose ports are not ours
    looked_into: int = 0  # other mount namespaces' directories read

    def use(self, job_id: str) -> None:
        """Read the rest of *job_id* (its token, last words, recording) where its discovery entries are."""
        if job_id in self.hidden:
            discovery.view_runtime_dir(self.hidden[job_id].path)


def scan(elsewhere: bool = True) -> HostJobs:
    """The jobs of our runtime directory and, with *elsewhere*, of other mount namespaces'."""
    own = discovery.runtime_dir(create=False)
    every = discovery.jobs_on_host(include_stale=True)
    live = discovery.jobs_on_host()
    found = HostJobs(live=live, every=every)
    if not elsewhere:
        return found
    for hidden in namespaces.hidden_runtime_dirs(own if own.is_dir() else None):
        found.looked_into += 1
        for job_id, ranks in discovery.group_by_job(discovery.entries_in(hidden.path)).items():
            if job_id in every:
                continue  # our own directory's word wins
            if not hidden.same_network:
                found.other_network.setdefault(job_id, hidden)
                continue
            # Ranks of one job may sit in several namespaces (a container per GPU): all of them.
            known = {e.rank for e in found.every.get(job_id, [])}
            fresh = [e for e in ranks if e.rank not in known]
            found.hidden.setdefault(job_id, hidden)
            found.every[job_id] = sorted(found.every.get(job_id, []) + fresh, key=lambda e: e.rank)
            alive = found.live.get(job_id, []) + [e for e in fresh if hidden.alive(e.pid)]
            if alive:
                found.live[job_id] = sorted(alive, key=lambda e: e.rank)
    return found


def where_we_looked(found: HostJobs) -> str:
    """Where this viewer looked for jobs, and why some it saw cannot be watched from here."""
    text = f"looked in {discovery.runtime_dir(False)}"
    if found.looked_into:
        text += f" and in {found.looked_into} private /tmp of other mount namespaces (through /proc/PID/root)"
    if found.other_network:
        job_id, hidden = sorted(found.other_network.items())[0]
        text += (f"; job {job_id} runs in another network namespace (pid {hidden.pid}'s), its ranks on "
                 f"its own loopback: watch it from inside (`nsenter -t {hidden.pid} -n -m ddptop attach`, "
                 "`docker exec`, `kubectl exec`)")
    return text
