"""`attnkit bench doctor-zoo` examines zoo families in a fresh process and records every verdict (the full table
is benchmarks/results/doctor_zoo.json)."""

import json

import pytest

from attnkit.cli.main import main

pytest.importorskip("transformers")


def test_bench_doctor_zoo_runs_and_records(tmp_path, capsys):
    assert main(["bench", "doctor-zoo", "--families", "granite", "--checks", "departures", "scale",
                 "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "doctor_zoo.json").read_text())
    granite = record["families"]["granite"]
    assert granite["config"] == "GraniteConfig" and granite["after"]["counts"]["INFO"] == 2
    assert granite["after"]["checks"]["scale"][0] == "INFO" and record["totals"]["after"]["FAIL"] == 0
    assert record["families_failing"] == {"after": []} and "granite" in capsys.readouterr().out


def test_a_process_that_stops_is_an_error_naming_the_families(tmp_path):
    from attnkit.bench.doctor_zoo import examine

    (tmp_path / "attnkit").mkdir()
    (tmp_path / "attnkit" / "__init__.py").write_text("raise ImportError('no attnkit here')\n")
    with pytest.raises(RuntimeError, match=r"(?s)the doctor's process stopped before \['bert'\] \(exit 1\):.*no attnkit"):
        examine(tmp_path, ["bert"], None, 0)
