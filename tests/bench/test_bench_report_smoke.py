"""``attnkit bench report`` end to end at toy sizes: the current attnkit and a git revision of it, each in a fresh
process, and the metrics' float32-vs-float64 comparison (numbers are not asserted: speed lives in the results)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from attnkit.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def _git_revision() -> str | None:
    if shutil.which("git") is None:
        return None
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def test_bench_report_times_the_current_code_against_a_revision(tmp_path, capsys):
    rev = _git_revision()
    if rev is None:
        pytest.skip("not a git checkout: the baseline is exported with git archive")
    assert main(["bench", "report", "--preset", "nano", "--n", "12", "40", "--dense-max", "32", "--sharpen", "4",
                 "--no-browser", "--baseline", rev, "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "report.json").read_text())
    assert record["baseline"] == rev and [r["n"] for r in record["rows"]] == [12, 40]
    for row in record["rows"]:
        assert row["write_s"] > 0 and row["baseline_write_s"] > 0 and row["bytes"] > 0
    assert record["rows"][1]["rows"] == "top-32 per row"
    assert all(m["max_abs_diff"] < 1e-6 for m in record["metrics"]), record["metrics"]
    assert "baseline" in capsys.readouterr().out
