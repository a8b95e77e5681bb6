"""The ranks of one run agree or stop (issue 21 item 10), with 2 gloo processes on 127.0.0.1 in bounded time:
rank 0 decides precision and the ``--minutes`` step count for every rank; ranks started with different settings
refuse with a typed error naming them (exit 2 on every rank); a rank that stops answering ends the job with a
message once the collectives' timeout (``ATTNKIT_DIST_TIMEOUT``) has passed, not after gloo's 30 minutes."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from train_helpers import cli_args, run_cli

from attnkit.runs.read import list_checkpoints, read_metrics, read_state
from attnkit.training import dist as tdist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
WORKER = Path(__file__).with_name("dist_worker.py")
BOUND = 150  # seconds: a hang fails the test instead of blocking the suite


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(scenario, args_of_rank, timeout_s=None, wait=(0, 1), cwd_of_rank=lambda rank: None):
    """Start ranks 0 and 1 (their own arguments and working folder each); return [(returncode, stdout, stderr),
    ...] of the ranks in ``wait`` and the seconds until they ended (the others are killed then)."""
    port, procs = _free_port(), []
    for rank in range(2):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if timeout_s is not None:
            env["ATTNKIT_DIST_TIMEOUT"] = str(timeout_s)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), scenario, *args_of_rank(rank)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd_of_rank(rank)))
    start, results = time.monotonic(), []
    try:
        for proc in (procs[r] for r in wait):
            out, err = proc.communicate(timeout=max(1.0, BOUND - (time.monotonic() - start)))
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results, time.monotonic() - start


def test_ranks_started_with_different_settings_refuse_naming_them(tmp_path):
    run = tmp_path / "run"
    results, _ = _two_ranks("plain", lambda r: cli_args(run, "--steps", "4", "--seq-len", str(32 + 16 * r),
                                                        "--seed", str(r)))
    for code, _, err in results:
        assert code == 2, err[-2000:]
        assert "the 2 ranks of this run were started with different settings" in err
        assert "--seed: rank 0 0, rank 1 1" in err and "--seq-len: rank 0 32, rank 1 48" in err
        assert "Traceback" not in err
    assert not list_checkpoints(run) and not (run / "metrics.jsonl").exists()  # refused before anything was written


def test_ranks_resuming_different_checkpoints_refuse_naming_it(tmp_path):
    """Node-local copies of a run under one path, whose newest checkpoints differ (steps 4 and 2): the ranks would
    train mixed steps into a mixed checkpoint; the settings check compares what each rank resumed (issue 33.7)."""
    first = run_cli(cli_args(tmp_path / "a" / "run", "--steps", "4", "--ckpt-every", "2", "--keep", "3"))
    assert first.returncode == 0, first.stderr[-2000:]
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(list_checkpoints(tmp_path / "b" / "run")[-1])  # rank 1's copy: newest is step 2
    results, _ = _two_ranks("plain", lambda r: ["train", "--resume", "run", "--steps", "6", "--no-progress"],
                            timeout_s=60, cwd_of_rank=lambda r: tmp_path / "ab"[r])
    for code, _, err in results:
        assert code == 2, err[-2000:]
        assert "the checkpoint resumed (run, step, weights): rank 0 {" in err and "'step': 4" in err
        assert "'step': 2" in err and "Traceback" not in err
    for copy, newest in (("a", 4), ("b", 2)):  # nothing trained, nothing written (metrics.jsonl as copied)
        assert [r["step"] for r in read_metrics(tmp_path / copy / "run" / "metrics.jsonl")] == [1, 2, 3, 4]
        assert read_state(list_checkpoints(tmp_path / copy / "run")[-1])["step"] == newest


def test_ranks_with_different_context_parallel_refuse_naming_it_within_the_timeout(tmp_path):
    """``--context-parallel 2`` on one rank, 1 on the other: the settings are compared before any process group
    of context parallelism is made, so both ranks end with one message naming the flag (issue 33.9)."""
    run = tmp_path / "run"
    results, seconds = _two_ranks("plain", lambda r: cli_args(run, "--steps", "4", "--context-parallel", str(2 - r)),
                                  timeout_s=60)
    for code, _, err in results:
        assert code == 2, err[-2000:]
        assert "--context-parallel: rank 0 2, rank 1 1" in err and "Traceback" not in err
        assert "another rank of this run stopped" not in err
    assert not run.exists()


def test_context_parallel_with_attention_dropout_is_refused_before_the_run_folder_is_written(tmp_path):
    """The context parallel backend has no attention dropout: refused with the model, before the run folder is
    touched, saying which flags to change (issue 33.12)."""
    run = tmp_path / "run"
    results, _ = _two_ranks("plain", lambda r: cli_args(run, "--steps", "4", "--context-parallel", "2",
                                                        "--dropout", "0.1"), timeout_s=60)
    for code, _, err in results:
        assert code == 2, err[-2000:]
        assert "attention dropout 0.1" in err and "train with --dropout 0 or --context-parallel 1" in err
        assert "backend='auto'" not in err and "Traceback" not in err
    assert not run.exists()


def test_rank_0_decides_precision_and_the_minutes_step_count_for_every_rank(tmp_path):
    run = tmp_path / "run"
    results, _ = _two_ranks("own-decisions", lambda r: _auto(cli_args(run, "--minutes", "0.05")))
    for code, _, err in results:
        assert code == 0, err[-3000:]
    state = read_state(list_checkpoints(run)[-1])
    assert state["precision"] == "fp32"  # rank 0's choice (rank 1 alone would have taken bf16)
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    # rank 0's probe said 0.01 s/step, rank 1's 0.04 s: the first plans differ, and so would each rank's re-plans
    # from its own step times (issue 23: --minutes re-plans as it runs); both ranks trained rank 0's plans to the
    # same last step (a rank that stopped elsewhere would leave the other waiting in a collective)
    assert state["total_steps"] == steps[-1] == state["time_budget"]["ran"] and steps == list(range(1, steps[-1] + 1))
    assert "world 2" in results[0][1]


def test_a_stop_on_one_rank_says_the_same_on_every_rank(tmp_path):
    """SIGTERM reaches rank 1 in step 3: every rank stops after that step, checkpointed once by rank 0, and every
    rank names that checkpoint (not "None") and the whole resume command, torchrun included (issue 31.5)."""
    run = tmp_path / "run"
    results, _ = _two_ranks("signal", lambda r: cli_args(run, "--steps", "8", "--ckpt-every", "4"), timeout_s=60)
    checkpoint = run / "checkpoints" / "step_00000003"
    for rank, (code, _, err) in enumerate(results):
        assert code == 128 + 15, err[-2000:]
        who = "SIGTERM" if rank == 1 else "another rank"
        assert f"stopped by {who} after step 3/8: checkpoint {checkpoint} written" in err, err[-2000:]
        assert "None" not in err and "Traceback" not in err
        assert f"resume with: torchrun --standalone --nproc-per-node 2 -m attnkit.cli.main train --resume {run}" in err
    assert [p.name for p in list_checkpoints(run)] == ["step_00000003"]


def _auto(args):
    """The arguments with ``--precision auto`` (the helpers pin fp32)."""
    i = args.index("--precision")
    return [*args[:i + 1], "auto", *args[i + 2:]]


def test_a_rank_that_stops_answering_ends_the_job_with_a_message_in_bounded_time(tmp_path):
    run = tmp_path / "run"
    results, seconds = _two_ranks("stops", lambda r: cli_args(run, "--steps", "50"), timeout_s=8, wait=(0,))
    code, _, err = results[0]
    assert code == 2, err[-3000:]
    assert "rank 0: another rank of this run stopped, died or hangs" in err
    assert "Collectives wait 8 s (ATTNKIT_DIST_TIMEOUT)" in err
    assert seconds < BOUND
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]  # step 3 never completed


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "inf"])
def test_a_bad_timeout_is_a_typed_error(monkeypatch, raw):
    monkeypatch.setenv("ATTNKIT_DIST_TIMEOUT", raw)
    with pytest.raises(ValueError, match=rf"ATTNKIT_DIST_TIMEOUT must be a number of seconds > 0, got '{raw}'"):
        tdist.timeout_s()


def test_the_settings_check_names_each_difference():
    every = [{"seq_len": 32, "seed": 0, "lr": 1.0}, {"seq_len": 48, "seed": 0, "lr": 2.0}]
    ctx = tdist.DistContext(0, 2)
    original = tdist.dist.all_gather_object
    try:
        tdist.dist.all_gather_object = lambda out, mine: out.__setitem__(slice(None), json.loads(json.dumps(every)))
        with pytest.raises(tdist.RanksDisagree, match=r"\(lr: rank 0 1.0, rank 1 2.0; seq_len: rank 0 32, rank 1 48\)"):
            tdist.check_same(every[0], ctx)
    finally:
        tdist.dist.all_gather_object = original
