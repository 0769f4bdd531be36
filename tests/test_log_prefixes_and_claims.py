"""Every prefix shape and every statement kind of #46, each on real lines.

The lines come from tests/data/logs (SOURCE.md) and the tune half of
tests/data/logs_heldout (tune/SOURCE.md names each thread); a shape neither holds is
taken from the public thread named beside it. The holdout half is not read here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddptop import api
from ddptop.diagnosis.claims import Claim, claim_findings
from ddptop.diagnosis.exit_reading import read_exit
from ddptop.diagnosis.story import blames, culprits
from ddptop.evidence.log_claims import claims_of
from ddptop.evidence.log_lines import parse_lines
from ddptop.evidence.log_prefixes import BY_NAME, SHAPES
from ddptop.evidence.scan import load_evidence
from ddptop.evidence.torchrun_log import read_console_log
from ddptop.protocol import STUB_LOCAL_RANK, RankState
from ddptop.status import Status

DATA = Path(__file__).parent / "data"
OLD, TUNE = DATA / "logs", DATA / "logs_heldout" / "tune"
HOLDOUT = DATA / "logs_heldout" / "holdout"
# Shapes whose only real lines are in the holdout half: tested once it was measured (the end).
HOLDOUT_ONLY = {"mpirun --timestamp-output", "mpich -prepend-rank", "horovodrun"}


def old(prefix: str) -> str:
    return next(OLD.glob(f"{prefix}-*.log")).read_text()


def tune(name: str) -> str:
    return (TUNE / f"{name}.log").read_text()


# --- one line reader for every prefix ------------------------------------------------------


def test_every_shape_of_the_table_has_a_test_here() -> None:
    tested = {"ansi colour", "viewer line number", "kernel log time", "cloudwatch table",
              "mpirun --tag-output", "srun --label", "pdsh / deepspeed host", "ray worker", "wrapper stream",
              "rich log time", "torchrun --tee", "torch rank"}
    assert {s.name for s in SHAPES} == tested | HOLDOUT_ONLY


def test_ansi_colours_come_off() -> None:
    """loguru's own colourised line (Delgan/loguru#301, the sink's bytes as printed there)."""
    line = ("\x1b[32m2020-07-28 08:07:21.759\x1b[0m | \x1b[1mINFO    \x1b[0m | \x1b[36m__main__\x1b[0m:"
            "\x1b[36m<module>\x1b[0m:\x1b[36m1\x1b[0m - \x1b[1m!\x1b[0m")
    (read,) = parse_lines(line)
    assert read.text == "2020-07-28 08:07:21.759 | INFO     | __main__:<module>:1 - !"


def test_a_viewers_line_numbers_come_off_and_are_no_rank() -> None:
    lines = parse_lines(old("33"))
    assert not any(ln.text.startswith("[174") for ln in lines) and all(ln.rank is None for ln in lines[:3])


def test_kernel_log_time_comes_off() -> None:
    """A kernel OOM line as quoted on the linux-kernel list (dmesg's [seconds.micros])."""
    (read,) = parse_lines("[ 1171.795551] Out of memory: Killed process 1669 (xdg-desktop-por) total-")
    assert read.text.startswith("Out of memory: Killed process 1669")


def test_a_cloudwatch_table_prefix_comes_off() -> None:
    lines = parse_lines(tune("cloudwatch-table-prefix-nccl-info"))
    assert lines[0].text.startswith("algo-1:18564:18638 [2] NCCL INFO P2P Chunksize")


def test_mpiruns_tag_gives_the_rank() -> None:
    lines = parse_lines(tune("mpirun-stdout-nccl-warn-invalid-root"))
    assert {ln.rank for ln in lines} == {1} and lines[0].text.startswith("slave1:126624:126758 [1]")
    assert parse_lines(old("22"))[0].rank == 0


def test_srun_label_gives_the_task_only_where_every_line_has_one() -> None:
    # No posted srun -l log in either corpus: the lines are srun's documented shape.
    assert [ln.rank for ln in parse_lines("0: step 1\n1: step 1\n3: RuntimeError: x\n")] == [0, 1, 3]
    assert parse_lines("epoch 1\nepoch 2\n3: not a prefix\n")[2].rank is None


def test_pdsh_host_prefix_gives_the_host() -> None:
    lines = parse_lines(old("17"))
    assert any(ln.host == "202.197.0.170" and ln.rank == 1 for ln in lines)


def test_a_ray_workers_prefix_gives_its_address_and_keeps_the_rank_prefix_after_it() -> None:
    lines = parse_lines(tune("ray-worker-prefix-remote-error"))
    assert lines[1].host == "172.19.24.110" and lines[1].text.startswith("mlx5: host_unknown")
    assert lines[2].rank == 1 and lines[2].text.startswith("[E1224 13:23:05")


def test_a_wrappers_stream_prefix_comes_off() -> None:
    assert parse_lines(old("35"))[0].text.startswith("WARNING:torch.distributed.elastic")


def test_richs_log_time_comes_off_and_its_continuation_too() -> None:
    lines = parse_lines(tune("ecc-rich-traceback-no-rank-accelerate"))
    assert lines[3].text.startswith("WARNING  Sending process 197")
    assert lines[4].text.startswith("WARNING  Sending process 198")


def test_torchrun_tee_and_the_rank_prefix() -> None:
    """[defaultN]: is a local worker (no rank); [rankN]: is the global rank (24, tune)."""
    assert parse_lines(old("24"))[0].rank == 2
    lines = parse_lines(tune("rank-prefix-cuda-oom-rank11-sigterm"))
    assert lines[0].rank == 11 and lines[0].text.startswith("  File")
    tee = BY_NAME["torchrun --tee"].pattern
    assert not tee.match("[rank12]:")
    # [default0]:[rank12]: (pytorch/pytorch#113128; a line of the holdout half, read after it was measured)
    ecc = parse_lines(holdout("ecc-watchdog-default-prefix-rank12"))
    assert ecc[0].rank == 12 and ecc[0].text.startswith("[E817 17:40:34")
    assert ecc[1].rank is None and ecc[1].text.startswith("Compile with")  # a worker's line: no rank


def test_an_unknown_prefix_is_learnt_from_its_repetition() -> None:
    """25: 'dinov2-giant-nodes.cn-d004 [stderr] ' before every rank's line: no row of the table;
    learnt, taken off, and the [rankN]: after it read for its rank."""
    lines = parse_lines(old("25"))
    assert lines[0].rank == 14 and lines[0].text.startswith("[E909 09:55:29")
    # NCCL's own host:pid:tid [dev] is a statement's shape, never learnt as a prefix.
    nccl = parse_lines(tune("nccl-tests-socket-closed-host-prefix"))
    assert nccl[0].text.startswith("gpu004:2200689:2200706 [3]")


def holdout(name: str) -> str:
    return (HOLDOUT / f"{name}.log").read_text()


# Written after the holdout half was measured (its only real lines of these shapes).


def test_mpiruns_timestamp_then_tag_come_off_and_give_the_rank() -> None:
    lines = parse_lines(holdout("mpirun-timestamped-cuda-invalid-argument"))
    assert lines[0].rank == 0 and lines[0].text.startswith("tomte401:1850301:1881341 [0] transport.cc:154")
    assert lines[-1].rank == 3


def test_mpichs_prepend_rank_is_told_from_a_viewers_line_numbers() -> None:
    lines = parse_lines(holdout("mpich-prepend-rank-nccl-info"))
    assert [ln.rank for ln in lines[:3]] == [0, 0, 1] and lines[0].text.startswith("node0:13571:13571 [0]")
    assert all(ln.rank is None for ln in parse_lines(old("33"))[:3])  # "[1744] " "[1745] ": line numbers


def test_horovodruns_short_tag_gives_the_rank() -> None:
    lines = parse_lines(holdout("horovodrun-short-stderr-prefix"))
    assert lines[1].rank == 1 and lines[1].text.startswith("RuntimeError: ncclCommInitRank failed")


def test_nccls_cuda_failure_names_its_process_and_alike_on_two_ranks_no_one() -> None:
    said = _claims(holdout("nccl-warn-cuda-oom-dev3-socket-closed"))
    cuda = [c for c in said if c.kind == "nccl_cuda_failure"]
    assert cuda and cuda[0].place == "ng30903 pid 3063028 GPU 3" and not cuda[0].culprits
    said = _claims(holdout("mpirun-timestamped-cuda-invalid-argument"))
    both = [c for c in said if c.kind == "nccl_cuda_failure"]
    assert {r for c in both for r in c.culprits} == {0, 3}
    assert not any(blames(f) for f in claim_findings(both))


# --- statements ranked by strength, with their source ---------------------------------------


def _claims(text: str) -> list[Claim]:
    return claims_of(parse_lines(text))


def test_the_monitored_barrier_names_its_culprit_over_the_order_of_lines() -> None:
    (claim,) = _claims(tune("monitored-barrier-rank1-names-rank0"))
    assert (claim.culprits, claim.victims) == ([0], [1]) and "monitored barrier" in claim.source
    (lead,) = claim_findings([claim])
    assert blames(lead) and culprits(lead) == {0} and lead.victims == [1]


def test_a_ranks_own_cuda_error_names_it_and_one_without_a_rank_names_none() -> None:
    # torch 2.1's line, as the issue quotes it from pytorch/pytorch#113128's description.
    (ecc,) = _claims("[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception: "
                     "CUDA error: uncorrectable ECC error encountered\n")
    assert ecc.culprits == [1] and "watchdog" in ecc.source
    assert blames(claim_findings([ecc])[0])
    (bare,) = _claims(tune("ecc-rich-traceback-no-rank-accelerate"))
    assert bare.kind == "cuda_error" and not bare.culprits
    assert not any(blames(f) for f in claim_findings([bare]))


def test_the_same_error_on_several_ranks_is_the_environments() -> None:
    one = _claims("[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception: "
                  "CUDA error: uncorrectable ECC error encountered\n"
                  "[E ProcessGroupNCCL.cpp:916] [Rank 3] NCCL watchdog thread terminated with exception: "
                  "CUDA error: uncorrectable ECC error encountered\n")
    (finding,) = claim_findings(one)
    assert not finding.certain and finding.ranks == [1, 3]


@pytest.mark.parametrize(("name", "place"), [
    ("netib-peer-error12-one-line", "11.214.147.122:39138"),
    ("nccl-tests-socket-closed-host-prefix", "gpu004.ds-a4-r02.abc.com:55693"),
    ("nccl-broken-pipe-remote-crash", "10.200.84.247:58355"),
], ids=lambda v: v if "." not in v else "")
def test_a_lost_peers_address_is_the_lead_and_no_rank(name: str, place: str) -> None:
    peers = [c for c in _claims(tune(name)) if c.kind == "peer_address"]
    assert peers[0].place == place
    (finding,) = claim_findings(peers)
    assert finding.kind == "host_unreachable" and place in finding.title and not blames(finding)


def test_who_lost_the_peer_is_told_by_how_the_address_is_written() -> None:
    """gloo writes [addr]:port (30); NCCL host<port>, even in an error's "Last error:" (a line of
    the holdout half, added after it was measured: the words said "gloo" there)."""
    (claim,) = _claims(old("30"))
    assert claim.place == "18.25.6.30:30872" and claim.source == "gloo"
    (nccl,) = _claims("Net : Connection closed by remote peer user<43236>\n")
    assert nccl.place == "user:43236" and nccl.source == "NCCL"


def test_a_duplicate_gpu_is_a_set_up_error_of_both_ranks() -> None:
    claims = _claims(tune("nccl-duplicate-gpu-one-device-two-ranks"))
    assert {tuple(c.named) for c in claims} == {(0, 1)}
    (finding,) = claim_findings(claims)
    assert not blames(finding) and "set-up" in finding.title


# The kernel's two lines of one kill, as dmesg printed them (ShengcaiLiao/QAConv#19, comment of
# 2021-12-30), and torchrun's line of a job the OOM killer ended (xxayt/MGSV#2): real, unedited.
OOM_KILL = ("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
            "task_memcg=/user.slice/user-1000.slice/user@1000.service,task=python,pid=698405,uid=1000\n"
            "[441280.839852] Out of memory: Killed process 698405 (python) total-vm:49978204kB, "
            "anon-rss:12918388kB, file-rss:68668kB, shmem-rss:53352kB, UID:1000 pgtables:49772kB "
            "oom_score_adj:0\n")
TORCHRUN_KILLED = ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 "
                   "(pid: 178) of binary: /root/miniconda3/envs/MGSV_env/bin/python\n")


def test_the_oom_killer_names_the_pid_it_killed_and_no_rank_the_log_does_not_tie_to_it() -> None:
    (claim,) = _claims(OOM_KILL)  # its two lines are one kill: one claim
    assert claim.kind == "oom_killer" and claim.place == "pid 698405" and not claim.culprits
    assert "(python)" in claim.words and claim.source == "the kernel (dmesg)"


def test_the_oom_killers_pid_is_no_ranks_where_no_rank_of_the_log_had_it(tmp_path: Path) -> None:
    """Two real logs' lines in one file: torchrun's rank 0 was pid 178, the kernel killed pid
    698405 (another machine): the kill is not given to rank 0. (No public thread held both lines
    of one pid: the pairing of a pid with its rank has no real-line test of its own.)"""
    log = tmp_path / "console.log"
    log.write_text(TORCHRUN_KILLED + OOM_KILL)
    (claim,) = read_console_log(log).claims
    assert claim.kind == "oom_killer" and claim.culprits == [] and "pid of rank" not in claim.source


def test_a_bundle_exported_from_a_log_keeps_its_claims_and_is_judged_as_the_log(tmp_path: Path) -> None:
    """`ddptop export` of a console log: the monitored barrier's claim travels in the bundle's
    findings record, so `doctor` on the bundle names rank 0 as it does on the log."""
    log, bundle = TUNE / "monitored-barrier-rank1-names-rank0.log", tmp_path / "barrier.ddptop"
    api.export(log, bundle)
    kept = load_evidence([bundle]).log_claims
    assert kept == load_evidence([log]).log_claims and [c.culprits for c in kept] == [[0]]
    for path in (log, bundle):
        blamed = {r for f in api.read_evidence(path).findings.findings if blames(f) for r in culprits(f)}
        assert blamed == {0}, path


def test_the_rank_that_reports_the_monitored_barrier_is_a_victim_not_a_culprit() -> None:
    """'Rank 1 successfully reached monitoredBarrier, but received errors while waiting for
    send/recv from rank 0' (two public logs): rank 0 alone is blamed, certain; rank 1, which
    waited, is a victim and not among the finding's ranks (#53: it was [0, 1])."""
    for log in (TUNE / "monitored-barrier-rank1-names-rank0.log",
                TUNE.parent / "holdout2" / "monitored-barrier-rank1-names-rank0-gloo-peer.log"):
        (stall,) = [f for f in api.read_evidence(log).findings.findings if f.kind == "collective_stall"]
        assert (stall.ranks, stall.victims, stall.certain) == ([0], [1], True), (log.name, stall)


def test_an_xid_line_names_a_gpu_of_a_host() -> None:
    """NVIDIA/NVSentinel#155: 'NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus'."""
    (claim,) = _claims("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n")
    assert claim.kind == "xid" and "PCI:0000:44:00" in claim.place and not claim.culprits


def test_sruns_task_exits_are_read_as_how_tasks_ended() -> None:
    claims = _claims(tune("srun-task-ranges-world-size-mismatch"))
    assert len(claims) == 5 and claims[0].words == "task(s) 2-7: Exited with exit code 1"
    (finding,) = claim_findings(claims)
    assert not blames(finding) and "not why" in finding.title


# --- exit statuses read for what they usually mean -------------------------------------------


def _ended(signal: str = "", reason: str = "", code: int | None = None) -> RankState:
    return RankState(rank=3, local_rank=STUB_LOCAL_RANK, world_size=0, host="", pid=0, job_id="j",
                     status=Status.CRASHED, time=0.0, exit_signal=signal, exit_reason=reason, exit_code=code)


@pytest.mark.parametrize(("state", "alone", "certain"), [
    (_ended("SIGABRT", "died of SIGABRT"), False, False),  # the watchdog's abort: a victim
    (_ended("SIGKILL", "died of SIGKILL"), False, False),  # the OOM killer or a kill
    (_ended("SIGKILL", "died of SIGKILL"), True, True),  # a one-process job's only rank
    (_ended("SIGSEGV", "died of SIGSEGV"), False, True),  # the crash itself
    (_ended(reason="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 GiB.", code=1),
     False, True),
    (_ended(reason="[Rank 11] Timeout at NCCL work: 15734, last enqueued NCCL work: 15735", code=1),
     False, False),
    (_ended(reason="RuntimeError: Rank 1 successfully reached monitoredBarrier, but received errors", code=1),
     False, False),
    (_ended(reason="work = group.barrier(opts=opts)", code=1), False, False),  # traceback cut in a collective
    (_ended(reason="exited with code 1", code=1), False, False),  # an exit code alone
    # horovod's words for an NCCL call that failed (pytorch/ignite#3466, the holdout's line): the
    # communicator's failure, read like torch's "NCCL error ... unhandled cuda error"
    (_ended(reason="RuntimeError: ncclCommInitRank failed: unhandled cuda error (run with NCCL_DEBUG=INFO "
                   "for details)", code=1), False, False),
], ids=["sigabrt", "sigkill", "sigkill-alone", "sigsegv", "own-exception", "nccl-timeout",
        "monitored-barrier", "cut-in-barrier", "code-alone", "nccl-call-failed"])
def test_exit_statuses_are_read_for_what_they_usually_mean(state: RankState, alone: bool,
                                                           certain: bool) -> None:
    assert read_exit(state, alone).certain is certain
