"""Shared set-up of the training tests: a tiny corpus, small configs, the CLI in a subprocess."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from attnkit.training import TrainConfig

CORPUS = Path(sysconfig.get_paths()["stdlib"]) / "json"  # 5 small files on every machine


def small_config(run_dir, **changes) -> TrainConfig:
    """A nano model on the json package's sources: a step takes milliseconds."""
    base = {"run_dir": str(run_dir), "preset": "nano", "data": str(CORPUS), "val_fraction": 0.2, "seq_len": 32,
            "batch_size": 4, "steps": 12, "warmup": 3, "eval_every": 6, "eval_batches": 2, "ckpt_every": 4,
            "precision": "fp32", "progress": False, "lr": 3e-3}
    return TrainConfig(**{**base, **changes})


def cli_args(run_dir, *extra) -> list[str]:
    return ["train", "--run-dir", str(run_dir), "--preset", "nano", "--data", str(CORPUS), "--seq-len", "32",
            "--batch-size", "4", "--warmup", "3", "--eval-every", "6", "--eval-batches", "2", "--precision", "fp32",
            "--no-progress", "--lr", "3e-3", *extra]


def run_cli(args, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "attnkit.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=120, **kwargs)



def quiet(*args, **kwargs):
    """A ``log`` that prints nothing."""


def trained_run(tmp_path_factory, name: str, **changes) -> Path:
    """A run trained once per test module (``small_config`` with ``changes``), for tests to copy."""
    from attnkit.training import train

    run = tmp_path_factory.mktemp(name) / "run"
    train(small_config(run, **changes), log=quiet)
    return run


def copy_run(run, tmp_path, name: str = "copy") -> Path:
    """A copy of the run folder ``run`` (its lock file left out) under ``tmp_path``."""
    copy = Path(tmp_path) / name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".attnkit.lock"))
    return copy
