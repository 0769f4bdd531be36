"""Where an opened rank's on-demand fields stand, and how the detail screen shows them.

In the node agents' digest lane (:mod:`ddptop.digest`) a rank's on-demand fields (env,
threads, GPU temperature, loaders' progress, ...) are only as fresh as its last detail, which
may be an hour old. The rank detail screen asks the source for a fresh whole state when it
opens and again every :data:`REFRESH_S` while it stays open (or on a key); :class:`OnDemand`
keeps what came back and says, nvitop-style, how old the shown values are: "as of HH:MM:SS",
"fetching…" or "not available: <why>", never a silently stale number.

Pure bookkeeping and text (no Textual): the screen owns the worker and the timer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text

from ddptop.protocol import RankState
from ddptop.source import StatesResult
from ddptop.textfmt import human_bytes, human_duration

REFRESH_S = 5.0  # while the screen stays open: a state every few seconds, not every sample
FETCH_TIMEOUT_S = 5.0  # one request's wait; the next waits for it (one in flight per screen)
FETCHING = "fetching…"


def clock(t: float) -> str:
    """A wall-clock moment as a person reads it on this machine: 03:01:02."""
    return time.strftime("%H:%M:%S", time.localtime(t))


@dataclass
class OnDemand:
    """The fresh states of one opened rank: the last that came, and the request in flight."""

    rank: int
    state: RankState | None = None  # the last fresh whole state (None: none came yet)
    taken_at: float = 0.0  # when it was taken, on this viewer's clock
    fetching: bool = False  # a request is in flight (never more than one)
    why: str = ""  # the last request failed: why (cleared by the next that succeeds)
    requests: int = 0  # requests sent so far (what a test counts)

    def begin(self) -> bool:
        """A request may go out (and is now in flight): False while one is already."""
        if self.fetching:
            return False
        self.fetching, self.requests = True, self.requests + 1
        return True

    def settle(self, result: StatesResult) -> None:
        """The request in flight came back with *result* (a state, or why not)."""
        self.fetching = False
        state = result.states.get(self.rank)
        if state is None:
            self.why = result.errors.get(self.rank) or "no state in the answer"
            return
        self.state, self.taken_at, self.why = state, result.taken_at.get(self.rank, time.time()), ""

    def line(self) -> str:
        """How old the on-demand fields shown are, in a few words."""
        if self.why:
            shown = f"; shown as of {clock(self.taken_at)}" if self.state is not None else ""
            return f"not available: {self.why}{shown}"
        if self.state is None:
            return FETCHING
        return f"as of {clock(self.taken_at)}" + (f" ({FETCHING})" if self.fetching else "")


def on_demand_text(text: Text, st: RankState, line: str, now: float) -> None:
    """The on-demand fields of *st* (those the detail sections below do not show), under a
    title that says how old they are (*line*: :meth:`OnDemand.line`)."""
    text.append("\non demand\n", style="bold underline")
    style = "bold red" if line.startswith("not available") else "yellow" if line == FETCHING else "dim"
    text.append(f"env, loaders' progress and these: {line}\n", style=style)
    load = " ".join(f"{v:.1f}" for v in st.load_avg) or "-"
    last_batch = human_duration(max(0.0, now - st.last_batch_at)) + " ago" if st.last_batch_at else "-"
    text.append(f"threads {'-' if st.threads is None else st.threads}  mem available "
                f"{human_bytes(st.mem_available_bytes)}  load {load}  last batch {last_batch}\n")
    if st.gpu is not None:
        g = st.gpu
        temp = "-" if g.temperature_c is None else f"{g.temperature_c:.0f}°C"
        power = "-" if g.power_w is None else f"{g.power_w:.0f} W"
        text.append(f"gpu temperature {temp}  power {power}  uuid {g.uuid or '-'}  "
                    f"driver {g.driver or '-'}\n")
    r = st.reporter
    text.append(f"reporter {r.samples} samples, {r.clients} clients, sample cost "
                f"{human_duration(r.sample_cost_s)}, {r.errors} errors, {r.dropped} dropped\n")
