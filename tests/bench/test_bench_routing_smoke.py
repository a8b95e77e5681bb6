"""`attnkit bench routing` and `attnkit tune` run end to end on a tiny grid and record what they measured (never
asserted as speed): every capable backend timed per cell, both routers' choices and regrets, the calibration
written to the cache folder given (never the repository)."""

import json

import pytest
import torch

from attnkit.backends import cost
from attnkit.bench import tune
from attnkit.cli.main import main


def test_bench_routing_runs_and_records(tmp_path):
    assert main(["bench", "routing", "--repeats", "1", "--lengths", "128", "--kinds", "causal", "sliding64", "sinks",
                 "--dtypes", "fp32", "--directions", "forward", "train", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "routing.json").read_text())
    rows = record["rows"]
    assert len(rows) == 2 * 3 + 3 + 2  # kinds x directions + 3 decode steps (forward) + MHA (causal, sliding128)
    for row in rows:
        assert row["fastest"] in row["times_ms"] and row["auto"] in row["times_ms"] and row["baseline"] in row["times_ms"]
        assert row["regret"] >= 1.0 and row["baseline_regret"] >= 1.0
        assert row["regret"] == pytest.approx(row["times_ms"][row["auto"]] / row["times_ms"][row["fastest"]])
    assert {r["auto"] for r in rows if r["kind"] == "sinks"} <= {"math"} | {
        n for n in ("sdpa", "blocksparse", "eager") if any(n in r["times_ms"] for r in rows if r["kind"] == "sinks")}
    s = record["summary"]
    assert s["cells"] == len(rows) and s["auto"]["worst"] >= s["auto"]["geomean"] >= 1.0
    assert "load_1min" in record and record["calibration"]
    assert (tmp_path / "routing.png").stat().st_size > 0


def test_tune_writes_a_calibration_auto_then_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNKIT_CALIBRATION", "")
    monkeypatch.setattr(cost, "_LOADED", {})
    monkeypatch.setattr(tune, "LENGTHS", (128,))
    monkeypatch.setattr(tune, "KINDS", ("causal", "sliding64"))
    monkeypatch.setattr(tune, "DECODE", (("causal", 256),))
    assert main(["tune", "--dtypes", "fp32", "--repeats", "1"]) == 0
    path = cost.calibration_path("cpu")
    assert path.is_relative_to(tmp_path)
    written = json.loads(path.read_text())
    assert {"sdpa/float32/forward", "blocksparse/float32/train"} <= set(written["table"])
    assert all(c >= 0 for t in written["table"].values() for c in t.values())
    active = cost.active(torch.device("cpu"))
    assert active.source == str(path) and active.coefficients("sdpa", torch.float32, "forward")
    assert main(["tune", "--show"]) == 0
