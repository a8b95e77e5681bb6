"""Nothing lost: a run killed with SIGKILL resumes with ``attnkit train --resume`` and reproduces the
uninterrupted run bitwise on CPU, step for step (losses and final weights)."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import cli_args, run_cli

from attnkit.runs.read import list_checkpoints
from attnkit.training.metrics import read_metrics

STEPS = ["--dropout", "0.1", "--steps", "40", "--ckpt-every", "3", "--preset", "tiny", "--seq-len", "64", "--batch-size", "8"]


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl")]


def _final_weights(run_dir):
    return load_file(str(list_checkpoints(run_dir)[-1] / "model.safetensors"))


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
    ref_dir, killed_dir = tmp_path / "ref", tmp_path / "killed"
    ref = run_cli(cli_args(ref_dir, *STEPS))
    assert ref.returncode == 0, ref.stderr

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "attnkit.cli.main", *cli_args(killed_dir, *STEPS)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if len(list_checkpoints(killed_dir)) and len(_losses(killed_dir)) >= 14:
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed: make it longer"
    done = _losses(killed_dir)
    assert 0 < len(done) < 40

    resumed = run_cli(["train", "--resume", str(killed_dir), "--no-progress"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed" in resumed.stdout
    assert _losses(killed_dir) == _losses(ref_dir)  # exact floats, every step
    a, b = _final_weights(ref_dir), _final_weights(killed_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
