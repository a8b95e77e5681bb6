"""`attnkit bench train` runs end to end on a tiny size and records what it measured (not the speed: benchmarks
are run by command, never asserted in tests)."""

import json

from attnkit.cli.main import main


def test_bench_train_runs_and_records(tmp_path):
    assert main(["bench", "train", "--preset", "nano", "--batch-size", "2", "--seq-len", "32", "--repeats", "1",
                 "--no-memory", "--long-seq-len", "0", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "train.json").read_text())
    assert record["default_precision"] in ("fp32", "bf16") and record["precision_evidence"]["summary"]
    assert {"reference fp32", "attnkit fp32", "attnkit packed"} <= set(record["results"])
