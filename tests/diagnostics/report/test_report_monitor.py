"""``attnkit train --monitor``: the attention monitor's verdicts land in metrics.jsonl, and the report of the run
draws them."""

import json

import pytest

from attnkit.cli.main import main
from attnkit.diagnostics.monitor import monitor_hook
from attnkit.errors import AttnkitValueError
from attnkit.training import train
from attnkit.training.metrics import read_metrics
from training.train_helpers import cli_args, small_config


def test_monitor_verdicts_land_in_metrics(tmp_path):
    train(small_config(tmp_path / "run", steps=6), log=lambda *a: None, hooks=[monitor_hook(3)])
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    checked = [r["step"] for r in records if "attention" in r]
    assert checked == [1, 3, 6]
    first = next(r for r in records if "attention" in r)["attention"]
    assert list(first) == ["blocks.0.attn", "blocks.1.attn"]  # the nano preset: 2 layers x 2 heads
    info = first["blocks.0.attn"]
    assert len(info["verdicts"]) == 2 and set(info["verdicts"]) <= {"healthy", "uniform", "collapsed", "empty"}
    assert len(info["norm_entropy"]) == 2 and info["max_logit"] > 0
    assert all("attention" not in r for r in records if r["step"] not in (1, 3, 6))


def test_cli_train_monitor_then_report_shows_the_verdicts(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(cli_args(run, "--steps", "4", "--monitor", "2")) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "attention" in r] == [1, 2, 4]
    assert main(["report", str(run), "--text", "import json", "--no-doctor"]) == 0
    page = (run / "report.html").read_text()
    assert "attention monitor: heads per verdict" in page and "at step 4 (the last check)" in page


def test_monitor_every_must_be_positive():
    with pytest.raises(AttnkitValueError, match="monitor every must be a positive int, got 0; the steps between checks"):
        monitor_hook(0)
