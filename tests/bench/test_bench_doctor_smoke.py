"""`attnkit bench doctor` runs a case end to end and records the command, its exit code, the wall and CPU time
and the target (never asserted: speed lives in benchmarks/results/doctor.json)."""

import json

from attnkit.cli.main import main


def test_bench_doctor_runs_and_records(tmp_path, capsys):
    assert main(["bench", "doctor", "--cases", "doctor-tiny", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "doctor.json").read_text())
    case = record["cases"]["doctor-tiny"]
    assert case["command"] == "attnkit doctor tiny -q" and case["target_s"] == 5.0
    assert [r["rc"] for r in case["runs"]] == [0] and case["cpu_s"] > 0 and case["wall_s"] >= case["cpu_s"] / 16
    assert record["machine"]["threads"] >= 1 and "doctor-tiny" in capsys.readouterr().out
