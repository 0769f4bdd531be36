"""A busy node for the benchmarks: the viewer keeps one core, the other is fully busy.

On a GPU node the viewer shares the CPU with the job's own processes. :class:`BusyNode`
makes that on purpose: this process (the viewer: every thread it has and will start) is
pinned to one core; the synthetic job (the generator, every thread) and a CPU burner started
here are pinned to the other. The burner runs at nice 19, so it takes exactly what the
generator leaves: that core is at 100 % while the generator sends what it sends on an idle
machine (the table shows both its CPU and its events per second, so a slower job cannot
pass for a faster viewer). :class:`IdleNode` is the same interface with nothing pinned and no
burner: the two run one after the other on one generator (A/B), as ratios of one run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import psutil

BURN = "while True:\n    pass\n"


def _pin(pid: int, cores: set[int]) -> None:
    """Every thread of process *pid* on *cores* (sched_setaffinity binds one thread; threads
    started later inherit their creator's mask)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended meanwhile


def _cpu_s(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


class IdleNode:
    """Nothing pinned, no burner; measures the generator's CPU share while it is entered."""

    mode = "idle"

    def __init__(self, generator_pid: int) -> None:
        self._generator = psutil.Process(generator_pid)
        self._began_wall = 0.0
        self._began_cpu: dict[str, float] = {}
        self.usage: dict[str, float] = {}  # name -> share of one core, 0..100, once exited

    def _processes(self) -> dict[str, psutil.Process]:
        return {"generator": self._generator}

    def __enter__(self) -> IdleNode:
        self._began_wall = time.monotonic()
        self._began_cpu = {name: _cpu_s(p) for name, p in self._processes().items()}
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        wall = max(1e-9, time.monotonic() - self._began_wall)
        self.usage = {f"{name}_cpu_pct": 100 * (_cpu_s(p) - self._began_cpu[name]) / wall
                      for name, p in self._processes().items()}


class BusyNode(IdleNode):
    """The viewer on one core; the generator and a nice-19 burner on the other."""

    mode = "busy"

    def __init__(self, generator_pid: int) -> None:
        super().__init__(generator_pid)
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            raise RuntimeError("--busy needs two cores: one for the viewer, one kept busy")
        self.viewer_core, self.busy_core = {cores[0]}, {cores[1]}
        self._all = set(cores)
        self._burner: subprocess.Popen[bytes] | None = None

    def _processes(self) -> dict[str, psutil.Process]:
        found = super()._processes()
        if self._burner is not None:
            found["burner"] = psutil.Process(self._burner.pid)
        return found

    def __enter__(self) -> BusyNode:
        _pin(os.getpid(), self.viewer_core)
        _pin(self._generator.pid, self.busy_core)
        self._burner = subprocess.Popen(
            [sys.executable, "-c", BURN], preexec_fn=lambda: (os.sched_setaffinity(0, self.busy_core),
                                                              os.nice(19)))
        super().__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        super().__exit__(kind, exc, tb)
        if self._burner is not None:
            self._burner.kill()
            self._burner.wait(timeout=10)
            self._burner = None
        _pin(os.getpid(), self._all)
        if self._generator.is_running():
            _pin(self._generator.pid, self._all)


def node(mode: str, generator_pid: int) -> IdleNode:
    """The node of *mode* ("idle" or "busy") around the generator *generator_pid*."""
    return BusyNode(generator_pid) if mode == "busy" else IdleNode(generator_pid)
