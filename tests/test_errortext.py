"""The innermost cause under the wrapper (#34 item 3), from errors real code raises here.

Each text is what Python printed for an exception raised in this process: a DataLoader
worker's error (a real DataLoader with a worker process), a chained exception, and the
child's error ``torch.multiprocessing.spawn`` raises as ProcessRaisedException; plus the
chained DataLoader traceback of tests/data/logs/36 (a real job's).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest

from ddptop.errortext import innermost

LOGS = Path(__file__).parent / "data" / "logs"


class _Bad:
    """A dataset whose items cannot be made: the worker raises."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        raise OSError(28, "No space left on device", "/dev/shm/torch_123_0")


def _printed(fn: Any) -> str:
    try:
        fn()
    except BaseException as exc:  # the text of whatever it raised
        return "".join(traceback.format_exception(exc))
    raise AssertionError("nothing was raised")


def test_a_dataloader_workers_own_error_is_the_cause() -> None:
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader(_Bad(), batch_size=1, num_workers=1)  # type: ignore[arg-type]
    text = _printed(lambda: next(iter(loader)))
    assert "Caught OSError in DataLoader worker process 0" in text  # the wrapper torch printed
    cause = innermost(text)
    assert cause.error.startswith("OSError: [Errno 28] No space left on device"), cause
    assert cause.wrapper.startswith("OSError: Caught OSError in DataLoader worker process 0"), cause
    assert cause.text().startswith("OSError: [Errno 28]") and "raised as" in cause.text()
    # A rank's exit reason leads with that line (reporter/crash.describe_exception): read as is.
    from ddptop.reporter.crash import describe_exception

    try:
        next(iter(loader))
    except OSError as exc:
        told = describe_exception(type(exc), exc, exc.__traceback__)
    assert told.splitlines()[0] == cause.text(600) and innermost(told) == cause, told[:400]


def test_a_chain_gives_its_innermost_exception() -> None:
    def inner() -> None:
        try:
            {}["missing"]
        except KeyError as exc:
            raise RuntimeError("could not load the batch") from exc

    cause = innermost(_printed(inner))
    assert (cause.error, cause.wrapper) == ("KeyError: 'missing'", "RuntimeError: could not load the batch")


def test_a_spawned_childs_error_under_process_raised_exception(tmp_path: Path) -> None:
    mp = pytest.importorskip("torch.multiprocessing")
    text = _printed(lambda: mp.spawn(_child, nprocs=1, join=True))
    assert "ProcessRaisedException" in text
    cause = innermost(text)
    assert cause.error == "ValueError: rank 0 could not open its shard", cause
    assert "ProcessRaisedException" in cause.wrapper, cause


def _child(rank: int) -> None:
    raise ValueError(f"rank {rank} could not open its shard")


def test_a_real_jobs_chained_dataloader_error() -> None:
    text = "\n".join(ln.removeprefix("[rank7]: ").removeprefix("[rank7]:")
                     for ln in next(LOGS.glob("36-*.log")).read_text().splitlines())
    cause = innermost(text)
    assert cause.error.startswith("RuntimeError: DataLoader worker (pid 742) is killed by signal"), cause
    # The excerpt ends inside the outer traceback, before its error line: no wrapper is made up.
    assert cause.wrapper == "", cause


def test_plain_errors_stay_as_they_are() -> None:
    assert innermost("ValueError: boom (/x.py:3 in f)") == ("ValueError: boom", "")
    assert innermost("") == ("", "")
    assert innermost("died of SIGSEGV").error == "died of SIGSEGV"
