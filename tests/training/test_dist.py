"""torch.distributed: ``attnkit train`` under torchrun with 2 CPU processes (gloo DDP, one shard of every global
batch per rank) equals the 1-process run with the same global batch, within fp32 tolerance."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from train_helpers import cli_args, run_cli

from attnkit.runs.read import list_checkpoints
from attnkit.training.metrics import read_metrics

ARGS = ["--steps", "6", "--batch-size", "4", "--accum", "2", "--ckpt-every", "6", "--seq-len", "48"]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo")
def test_two_process_ddp_equals_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    single = run_cli(cli_args(one, *ARGS))
    assert single.returncode == 0, single.stderr
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "attnkit.cli.main", *cli_args(two, *ARGS)], env=env, capture_output=True, text=True,
                         timeout=300)  # minutes under a loaded full suite; no timing is asserted
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "world 2" in ddp.stdout
    losses_one = [r["loss"] for r in read_metrics(one / "metrics.jsonl")]
    losses_two = [r["loss"] for r in read_metrics(two / "metrics.jsonl")]
    assert len(losses_one) == len(losses_two) == 6
    assert losses_one[0] != losses_one[-1]  # it trained
    torch.testing.assert_close(torch.tensor(losses_two), torch.tensor(losses_one), rtol=1e-5, atol=1e-5)
    a = load_file(str(list_checkpoints(one)[-1] / "model.safetensors"))
    b = load_file(str(list_checkpoints(two)[-1] / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    # the ranks saw different rows: one process on half the batch differs
    half = run_cli(cli_args(tmp_path / "half", *[a if a != "4" else "2" for a in ARGS]))
    assert half.returncode == 0
    assert [r["loss"] for r in read_metrics(tmp_path / "half" / "metrics.jsonl")] != losses_one
