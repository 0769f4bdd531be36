"""Logs nobody tuned on (#46): tests/data/logs_heldout, split before any reader code.

The tune half was read while the reader was written; the holdout half was measured once,
at the end, and its figure pinned here as measured; it was spent then (one reader gap it showed
was fixed after). Holdout2, 22 more logs collected and committed before that fix, was measured
once after it, and its figure is pinned here as measured (nothing was changed after it). On all
of them, and on the old corpus:

* no healthy rank is ever named as a certain cause;
* no log is refused (the CLI's exit 2 is for a missing or unreadable path only);
* "right" (tests/log_scoring.py) holds at least the measured share;
* no step, host or pid the log does not hold is printed ("at step 0", "on ?", "pid ?").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddptop.cli.main import main
from tests.log_scoring import diagnose_path, score, truth_of

DATA = Path(__file__).parent / "data"
TUNE, HOLDOUT, OLD = DATA / "logs_heldout" / "tune", DATA / "logs_heldout" / "holdout", DATA / "logs"
HOLDOUT2 = DATA / "logs_heldout" / "holdout2"
# Measured: tune after the reader was written (14 of 20 before it, 11 refused, 1 healthy rank
# named); the old corpus before and after (30 -> 32 of 36: exit statuses read for what they mean
# stopped naming ranks 0 and 7 of 32 and 35); the holdout once, at the end: 17 of 19 (89 %; the
# two: rank 1's "ncclCommInitRank failed" read as its own exception, and a "CUDA error: unknown
# error" the thread shows on every GPU count read as rank 0's own). That holdout is spent since:
# an NCCL call's failure is now read as the communicator's (18 of 19); the other log's words are
# those of the holdout's rank-7 log whose thread names rank 7, so no reading of the text tells them
# apart, and it stays wrong.
# Holdout2: 22 logs collected and labelled after the first holdout was spent, committed before
# the reader changed again, measured once after that change: 20 of 22 (91 %), 0 healthy ranks
# named, none refused. The two: rank 1's watchdog line behind docker compose's and ray's prefixes
# with its colour codes pasted as text ("ESC[36m") is read without its rank; the tail of a
# torchrun summary without its "[0]:" header (rank 0, SIGSEGV) is not read at all.
# Tune3 and holdout3 (#54, the cluster's own words: SLURM, Open MPI, Horovod, launchers): split
# before the reader of #54 was written; tune3 was 6 of 8 before it, 8 of 8 after; holdout3 was
# measured once, at the end: 7 of 7, 0 healthy ranks named, none refused, each of its 5 traps
# answered by a `no_culprit` finding that says what was recognised.
# Tune4 (#54, second part: NCCL's RAS report, accelerate's launcher, Ray's workers): 9 logs, none
# singling out a rank, labelled before their reader was written: 9 of 9 right before it and after
# (nothing named either time), but before it none of the 9 said what was recognised; after it all
# 9 do. No held-out half was taken for this part: its figure is a tuning figure.
TUNE3, HOLDOUT3 = DATA / "logs_heldout" / "tune3", DATA / "logs_heldout" / "holdout3"
TUNE4 = DATA / "logs_heldout" / "tune4"  # RAS, accelerate, Ray (#54, second part): a tuning set only
RIGHT_AT_LEAST = {TUNE: 20, OLD: 32, HOLDOUT: 18, HOLDOUT2: 20, TUNE3: 8, HOLDOUT3: 7, TUNE4: 9}


@pytest.mark.parametrize("folder", [TUNE3, HOLDOUT3, TUNE4], ids=["tune3", "holdout3", "tune4"])
def test_every_trap_of_the_cluster_s_words_says_what_was_recognised(folder: Path) -> None:
    """#54: a log where no rank can be singled out is understood, not merely unread."""
    truth = truth_of(folder)
    for row in score(folder):
        if not truth[row.name]["culprits"]:
            told = [t for t in row.titles if t.startswith("recognised, no one blamed: ")]
            assert told, (row.name, row.titles)


@pytest.mark.parametrize("folder", [TUNE, OLD, HOLDOUT, HOLDOUT2, TUNE3, HOLDOUT3, TUNE4],
                         ids=["tune", "old", "holdout", "holdout2", "tune3", "holdout3", "tune4"])
def test_no_healthy_rank_named_no_log_refused_and_the_measured_share_right(folder: Path) -> None:
    rows = score(folder)
    assert len(rows) == len(truth_of(folder))
    assert not [r.name for r in rows if r.false], [(r.name, r.named, r.titles[:1]) for r in rows if r.false]
    assert not [r.name for r in rows if r.exit2]
    right = sum(r.right for r in rows)
    wrong = [(r.name, sorted(r.named), r.titles[:1]) for r in rows if not r.right]
    assert right >= RIGHT_AT_LEAST[folder], wrong
    if folder == HOLDOUT2:  # the issue's bar on logs nobody tuned on: at least 90 % right
        assert right * 10 >= len(rows) * 9, (right, len(rows), wrong)


def test_the_halves_hold_at_least_thirty_logs_a_third_of_them_singling_out_no_rank() -> None:
    tune, holdout = truth_of(TUNE), truth_of(HOLDOUT)
    assert len(tune) + len(holdout) >= 30 and not set(tune) & set(holdout)
    everyone = [*tune.values(), *holdout.values()]
    assert sum(1 for t in everyone if not t["culprits"]) * 3 >= len(everyone)
    assert {t["half"] for t in tune.values()} == {"tune"}
    assert {t["half"] for t in holdout.values()} == {"holdout"}
    old = (OLD / "SOURCE.md").read_text()
    for folder, truth in ((TUNE, tune), (HOLDOUT, holdout)):
        source = (folder / "SOURCE.md").read_text()
        for name in truth:
            thread = source.split(f"## {name}", 1)[1].split("- Thread: ", 1)[1].split(" ", 1)[0]
            assert thread.startswith("https://github.com/") and thread not in old, (name, thread)
            assert (folder / name).stat().st_size <= 64 << 10


def test_holdout2_was_collected_apart_a_third_of_it_singling_out_no_rank() -> None:
    """22 logs of threads no other set cites (tests/data/logs_heldout/SOURCE.md, 'holdout2')."""
    truth = truth_of(HOLDOUT2)
    assert len(truth) >= 20 and {t["half"] for t in truth.values()} == {"holdout2"}
    assert sum(1 for t in truth.values() if not t["culprits"]) * 3 >= len(truth)
    assert set(truth) == {p.name for p in HOLDOUT2.glob("*.log")}
    cited = "".join((folder / "SOURCE.md").read_text() for folder in (OLD, TUNE, HOLDOUT))
    source = (HOLDOUT2 / "SOURCE.md").read_text()
    threads = [source.split(f"## {name}", 1)[1].split("- Thread: ", 1)[1].split(" ", 1)[0] for name in truth]
    assert len(set(threads)) == len(threads)
    for name, thread in zip(truth, threads, strict=True):
        assert thread.startswith("https://github.com/") and thread not in cited, (name, thread)
        assert (HOLDOUT2 / name).stat().st_size <= 64 << 10


@pytest.mark.parametrize("path", [*sorted(TUNE.glob("*.log")), *sorted(OLD.glob("*.log")),
                                  *sorted(HOLDOUT2.glob("*.log"))], ids=lambda p: p.name)
def test_no_field_the_log_does_not_hold_is_printed(path: Path) -> None:
    for f in diagnose_path(path):
        assert f.step != 0 and f.since != 0, (f.step, f.since, f.title)  # --json: null, not 0
        for text in (f.title, *f.evidence):
            assert "at step 0" not in text and " on ?" not in text and "pid ?" not in text, text


@pytest.mark.parametrize("name", ["cloudwatch-table-prefix-nccl-info.log",
                                  "srun-task-ranges-world-size-mismatch.log",
                                  "netib-peer-error12-one-line.log",
                                  "monitored-barrier-rank1-names-rank0.log"])
def test_doctor_never_exits_2_on_a_readable_log(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", str(TUNE / name)])
    err = capsys.readouterr().err
    assert code in (0, 1), err
    assert re.search(r"\d+ lines?: ", err), err  # what was recognised, said in one line


def test_nothing_conclusive_is_said_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(TUNE / "cloudwatch-table-prefix-nccl-info.log")]) == 0
    captured = capsys.readouterr()
    assert "nothing conclusive" in captured.err and "what would tell" in captured.err
    assert "nothing conclusive" in captured.out


def test_exit_2_is_for_a_missing_or_unreadable_path(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(tmp_path / "missing.log")]) == 2
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    assert main(["doctor", str(binary)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) <= 2  # one-line errors, no traceback
