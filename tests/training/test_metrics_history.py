"""A run's history survives a bad line (issue 21 items 6 and 17): a resume keeps every intact record of
``metrics.jsonl`` and says what it skipped; records of an unexpected shape are skipped by every reader (the
report, a resume, the loss plot) instead of crashing it."""

import json

import pytest
from train_helpers import copy_run, small_config, trained_run

from attnkit.cli.main import main
from attnkit.runs.read import read_metrics
from attnkit.training import train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return trained_run(tmp_path_factory, "history", steps=8, ckpt_every=8)


def _copy_with_lines(run, tmp_path, replace: dict[int, str]):
    copy = copy_run(run, tmp_path)
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    for index, text in replace.items():
        lines[index] = text
    (copy / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return copy


BAD = {
    "cut": '{"step": 3, "loss": 5.1',
    "a list": "[1, 2, 3]",
    "a string step": '{"step": "3", "loss": 5.0}',
    "a string loss": '{"step": 3, "loss": "high"}',
    "an odd attention entry": '{"step": 3, "loss": 5.0, "attention": [1, 2]}',
    "verdicts not a list": '{"step": 3, "loss": 5.0, "attention": {"blocks.0": {"verdicts": 7}}}',
}


@pytest.mark.parametrize("bad", list(BAD), ids=list(BAD))
def test_resume_keeps_every_intact_record_and_warns_of_the_bad_line(run, tmp_path, bad):
    copy = _copy_with_lines(run, tmp_path, {2: BAD[bad]})  # the line of step 3
    logs = []
    train(small_config(copy, steps=10), resume=copy, given={"steps"}, log=logs.append)
    assert [r["step"] for r in read_metrics(copy / "metrics.jsonl")] == [1, 2, 4, 5, 6, 7, 8, 9, 10]
    warning = [line for line in logs if line.startswith("WARNING") and "skipped 1 line(s)" in line]
    assert warning and "line 3:" in warning[0] and "the other 7 records are kept" in warning[0], logs


def test_read_metrics_skips_records_of_another_shape_and_says_so(run, tmp_path):
    copy = _copy_with_lines(run, tmp_path, {1: BAD["a list"], 2: BAD["a string loss"], 4: BAD["cut"]})
    heard = []
    records = read_metrics(copy / "metrics.jsonl", on_skip=heard.append)
    assert [r["step"] for r in records] == [1, 4, 6, 7, 8]
    assert len(heard) == 1 and "skipped 3 line(s)" in heard[0]
    assert "line 2: a JSON list, not a record" in heard[0] and "line 3: loss is 'high', not a number" in heard[0]
    with pytest.warns(UserWarning, match="skipped 3 line"):
        read_metrics(copy / "metrics.jsonl")


def test_report_of_a_run_with_odd_records_is_written(run, tmp_path, capsys):
    copy = _copy_with_lines(run, tmp_path, {i: text for i, text in enumerate(BAD.values())})
    out = tmp_path / "r.html"
    with pytest.warns(UserWarning, match="skipped 6 line"):
        assert main(["report", str(copy), "--no-doctor", "--text", "def f", "--out", str(out)]) == 0
    assert out.stat().st_size > 0


def test_a_symlinked_metrics_file_is_not_followed(run, tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    (tmp_path / "metrics.jsonl").symlink_to(target)
    heard = []
    assert read_metrics(tmp_path / "metrics.jsonl", on_skip=heard.append) == []
    assert "not a regular file" in heard[0]
