"""The dashboard's redraw work at 8,192-32,768 ranks, in-process (no sockets, no terminal).

A JobModel of N synthetic ranks receives a quarter of its ranks' states between two redraws
(1 Hz samples, 4 redraws/s), then each redraw is timed the way it was (RowBuilder over every
rank, statuses by a loop, the header's pass over every state) and the way it is now above
GROUP_FROM_RANKS (RowIndex from the dirty ranks plus the ~55 rows on screen, the status
index, HeaderFacts). Medians of the rounds, in ms; one line per size.

    .venv/bin/python bench/redraw_scale.py --ranks 8192,32768 --rounds 8
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from ddptop.model.job import JobModel
from ddptop.protocol import CollectiveGroup, PendingOp, RankState, RecordEntry, StateMsg
from ddptop.tui.row_index import RowIndex
from ddptop.tui.rows import RowBuilder
from ddptop.tui.widgets.header import HeaderFacts, attach_state, identity_by_loop

T0 = 1_700_000_000.0
SCREEN_ROWS = 55


def _state(rank: int, n: int, t: float, odd: int) -> RankState:
    """A running rank waiting in all_reduce #seq, the odd one in all_gather."""
    seq = int(t - T0) + 300
    op = "nccl:all_gather" if rank == odd else "nccl:all_reduce"
    return RankState(rank=rank, local_rank=rank % 8, world_size=n, host=f"node-{rank // 8:05d}",
                     pid=1000 + rank, job_id="bench", time=t, start_time=T0 - 60, step=seq // 3,
                     last_step_at=t, step_time_s=0.3,
                     epoch=1, batch=seq % 100, batches_per_epoch=100, backend="nccl", data_wait_fraction=0.02,
                     collectives=[CollectiveGroup(pg="0", seq=seq, seq_changed_at=t, pending=[
                         PendingOp(seq=seq + 1, op=op, age_s=0.1, timeout_s=600.0)])],
                     cpu_percent=100.0, rss_bytes=4 << 30)


def _feed(model: JobModel, ranks: range, n: int, t: float, odd: int) -> None:
    for r in ranks:
        model.apply(RecordEntry(time=t, rank=r, message=StateMsg(state=_state(r, n, t, odd))))


def _timed(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - began)


def measure(n: int, rounds: int) -> dict[str, float]:
    """Median ms per redraw piece at *n* ranks."""
    model, odd = JobModel(), n // 3
    _feed(model, range(n), n, T0, odd)
    builder, index, facts = RowBuilder(), RowIndex(model), HeaderFacts(model)
    t = T0
    loop: Callable[[float], dict[int, str]] = model._statuses_full
    old_builder_model = _LoopStatuses(model)
    builder.build(old_builder_model, t)  # type: ignore[arg-type]
    index.refresh(t)
    got: dict[str, list[float]] = {k: [] for k in ("statuses_loop", "statuses_index", "rows_old", "rows_new",
                                                   "header_old", "header_new", "redraw_old", "redraw_new")}
    for i in range(rounds):
        t += 0.25
        quarter = n // 4
        _feed(model, range((i % 4) * quarter, (i % 4 + 1) * quarter), n, t, odd)
        now = t
        got["statuses_loop"].append(_timed(lambda: loop(now)))  # noqa: B023  # called at once
        got["rows_old"].append(_timed(lambda: builder.build(old_builder_model, now)))  # type: ignore[arg-type]  # noqa: B023
        got["header_old"].append(_timed(lambda: (identity_by_loop(model), attach_state(builder.statuses, n))))
        got["redraw_old"].append(got["rows_old"][-1] + got["header_old"][-1])
        began = time.perf_counter()
        got["statuses_index"].append(_timed(lambda: model.statuses(now)))  # noqa: B023
        shown = index.refresh(t)
        _ = shown[:SCREEN_ROWS]
        got["rows_new"].append(1000 * (time.perf_counter() - began) - got["statuses_index"][-1])
        got["header_new"].append(_timed(lambda: (facts.identity(), attach_state(index.statuses, n))))
        got["redraw_new"].append(1000 * (time.perf_counter() - began))
        assert isinstance(shown[0], object)
    return {k: statistics.median(v) for k, v in got.items()}


class _LoopStatuses:
    """The model as RowBuilder saw it before the status index: statuses by the full loop."""

    def __init__(self, model: JobModel) -> None:
        self._model = model

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)

    def statuses(self, now: float) -> dict[int, str]:
        return self._model._statuses_full(now)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8192,32768", help="comma-separated sizes")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    cols = ("statuses_loop", "statuses_index", "rows_old", "rows_new", "header_old", "header_new",
            "redraw_old", "redraw_new")
    print("ranks  " + "  ".join(f"{c:>14}" for c in cols) + "   (ms, median)")
    for n in (int(x) for x in args.ranks.split(",")):
        row = measure(n, args.rounds)
        print(f"{n:>5}  " + "  ".join(f"{row[c]:>14.1f}" for c in cols), flush=True)


if __name__ == "__main__":
    main()
