"""``attnkit train --context-parallel N`` under torchrun: the rows' sequences split over ranks train like one process."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from attnkit.training.metrics import read_metrics
from training.train_helpers import cli_args, run_cli

ARGS = ["--steps", "4", "--batch-size", "2", "--ckpt-every", "4", "--seq-len", "33", "--eval-every", "4"]


def _torchrun(n: int, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                           "-m", "attnkit.cli.main", *args], env=env, capture_output=True, text=True, timeout=300)


def _losses(run_dir):
    return torch.tensor([r["loss"] for r in read_metrics(run_dir / "metrics.jsonl")], dtype=torch.float64)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo")
@pytest.mark.parametrize("world", [2, 4], ids=["cp2", "dp2-x-cp2"])
def test_context_parallel_training_equals_one_process(tmp_path, world):
    """2 processes split each row in two; 4 = 2 data-parallel replicas x 2 context-parallel ranks."""
    one, many = tmp_path / "one", tmp_path / "many"
    single = run_cli(cli_args(one, *ARGS))
    assert single.returncode == 0, single.stderr[-3000:]
    run = _torchrun(world, *cli_args(many, *ARGS, "--context-parallel", "2"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"world {world}" in run.stdout
    a, b = _losses(one), _losses(many)
    assert len(a) == len(b) == 4 and a[0] != a[-1]  # it trained
    sent = [r["cp_bytes_sent"] for r in read_metrics(many / "metrics.jsonl")]
    assert sum(sent) > 0, "the ranks exchanged no key/value shard: the rows were not split"
    err = float((a - b).abs().max())
    assert err <= 1e-5 * float(a.abs().max()), f"world {world} losses {b.tolist()} vs one process {a.tolist()}"


def test_context_parallel_must_divide_the_world():
    from attnkit.distributed import groups

    with pytest.raises(ValueError, match="context_parallel=3 must be a positive int dividing the number of processes 2"):
        groups(0, 2, 3)


def test_linear_attention_models_are_refused():
    from attnkit.distributed import check_model
    from attnkit.nn import LinearAttention

    with pytest.raises(NotImplementedError, match="are linear attention"):
        check_model(torch.nn.Sequential(LinearAttention(16, 2)))


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo")
def test_context_parallel_run_resumes_bitwise(tmp_path):
    import shutil

    from attnkit.runs.read import list_checkpoints

    run = tmp_path / "run"
    first = _torchrun(2, *cli_args(run, *ARGS, "--ckpt-every", "2", "--context-parallel", "2"))
    assert first.returncode == 0, first.stderr[-3000:]
    crashed = tmp_path / "crashed"
    shutil.copytree(run, crashed)
    shutil.rmtree(list_checkpoints(crashed)[-1])  # as if killed between the checkpoints of steps 2 and 4
    resumed = _torchrun(2, "train", "--resume", str(crashed), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed" in resumed.stdout
    assert _losses(crashed).tolist() == _losses(run).tolist()  # exact floats, every step


def test_attention_dropout_is_refused_naming_the_settings():
    """The context parallel backend has no attention dropout: the model is refused when it is built (issue 33.12),
    not at its first forward."""
    from attnkit.distributed import check_model
    from attnkit.models.builders import build_lm

    with pytest.raises(NotImplementedError, match=r"attention dropout 0.1: .*train with --dropout 0 or "
                                                  r"--context-parallel 1"):
        check_model(build_lm("nano", dropout=0.1), names=lambda name: "--" + name.replace("_", "-"))
    check_model(build_lm("nano"))  # no dropout: served
